#include "engine/backend/cuda/block_runs.h"

#include <gtest/gtest.h>

#include <vector>

namespace agentkv::backend::cuda {
namespace {

bool Same(const BlockRun& r, int32_t block, int32_t index, int32_t count) {
  return r.first_block == block && r.first_index == index && r.count == count;
}

TEST(BlockRunsTest, ConsecutiveIdsMakeOneRun) {
  std::vector<BlockRun> runs;
  BlockRuns(std::vector<int32_t>{}, &runs);
  EXPECT_TRUE(runs.empty());
  BlockRuns(std::vector<int32_t>{4, 5, 6, 9, 3, 4, 4, 2}, &runs);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_TRUE(Same(runs[0], 4, 0, 3));
  EXPECT_TRUE(Same(runs[1], 9, 3, 1));
  EXPECT_TRUE(Same(runs[2], 3, 4, 2));
  EXPECT_TRUE(Same(runs[3], 4, 6, 1));  // a repeated id starts a new run
  EXPECT_TRUE(Same(runs[4], 2, 7, 1));
  // Runs of a second request start fresh, even when ids continue.
  std::vector<BlockRun> more;
  BlockRuns(std::vector<int32_t>{1, 2}, &more);
  BlockRuns(std::vector<int32_t>{3}, &more);
  ASSERT_EQ(more.size(), 2u);
  EXPECT_TRUE(Same(more[1], 3, 0, 1));
}

}  // namespace
}  // namespace agentkv::backend::cuda
