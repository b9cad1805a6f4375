#include "engine/backend/cuda/kv_read_hazards.h"

#include <gtest/gtest.h>

#include <vector>

namespace agentkv::backend::cuda {
namespace {

TEST(KvReadHazardsTest, AWriteWaitsForTheLatestPendingReadOfItsBlocks) {
  const std::vector<int32_t> blocks_per_group = {8, 4};
  KvReadHazards h(blocks_per_group);
  const std::vector<int32_t> none = {0, 1, 2};
  EXPECT_EQ(h.PendingFor(0, none, 0), 0u);  // nothing read yet
  h.NoteRead(0, std::vector<int32_t>{1, 2}, 1);
  h.NoteRead(0, std::vector<int32_t>{2, 5}, 2);
  h.NoteRead(1, std::vector<int32_t>{3}, 3);
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{0, 7}, 0), 0u);
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{1}, 0), 1u);
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{1, 5}, 0), 2u);
  // Block 2's latest read is ticket 2.
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{2}, 0), 2u);
  // Groups are separate: block 3 of group 0 was never read.
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{3}, 0), 0u);
  EXPECT_EQ(h.PendingFor(1, std::vector<int32_t>{3}, 0), 3u);
  // Completed reads need no wait.
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{1, 2, 5}, 2), 0u);
  EXPECT_EQ(h.PendingFor(0, std::vector<int32_t>{1, 2, 5}, 1), 2u);
}

TEST(KvReadHazardsTest, WrittenBlocksCoverTheStepsPositions) {
  const std::vector<int32_t> table = {40, 41, 42, 43};
  std::vector<int32_t> out;
  // One decode token at position 16: the second block only.
  KvReadHazards::WrittenBlocks(table, 16, 17, 16, 0, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{41}));
  out.clear();
  // A chunk from 15 to 33 touches blocks 0, 1 and 2.
  KvReadHazards::WrittenBlocks(table, 15, 33, 16, 0, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{40, 41, 42}));
  out.clear();
  // Nothing written, nothing touched; a table shorter than the positions
  // stops at its end.
  KvReadHazards::WrittenBlocks(table, 5, 5, 16, 0, &out);
  EXPECT_TRUE(out.empty());
  KvReadHazards::WrittenBlocks(table, 60, 90, 16, 0, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{43}));
  out.clear();
  // A ring: every block of it.
  KvReadHazards::WrittenBlocks(std::vector<int32_t>{7, 8}, 100, 101, 16, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 8}));
}

}  // namespace
}  // namespace agentkv::backend::cuda
