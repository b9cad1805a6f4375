#include "cache/kv_memory_budget.h"

#include <gtest/gtest.h>

#include "test_specs.h"

namespace agentkv::cache {
namespace {

using testing::FullSpec;
using testing::MakeSpec;
using testing::SlidingSpec;

TEST(KvMemoryBudgetTest, ExplicitBudgetWinsOverFraction) {
  EXPECT_EQ(KvBudgetBytes(12345, 1 << 30), 12345u);
  EXPECT_EQ(KvBudgetBytes(std::nullopt, 1000, 0.85), 850u);
  EXPECT_EQ(KvBudgetBytes(std::nullopt, 1000), 850u);  // default fraction
  EXPECT_EQ(KvBudgetBytes(std::nullopt, 1000, 0.5), 500u);
}

TEST(KvMemoryBudgetTest, FullAttentionGetsEverything) {
  const ModelCacheSpec spec = FullSpec();
  const uint64_t per_block = spec.BytesPerBlock(0, 16);
  ASSERT_EQ(per_block, 2u * 2 * 2 * 4 * 4 * 16);  // K+V, heads, dim, f32, 2 layers, tokens
  auto n = BlocksForBudget(spec, 16, 100 * per_block);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, (std::vector<int32_t>{100}));
  n = BlocksForBudget(spec, 16, 100 * per_block + per_block - 1);
  EXPECT_EQ(*n, (std::vector<int32_t>{100}));
}

TEST(KvMemoryBudgetTest, SlidingGroupsGetRingsForMaxSeqs) {
  const ModelCacheSpec spec = SlidingSpec(64);  // group 0 sliding (3 layers), 1 full
  const int bs = 16;
  const int ring = spec.RingBlocks(0, bs);  // 5
  const uint64_t s = spec.BytesPerBlock(0, bs), f = spec.BytesPerBlock(1, bs);
  const int32_t max_seqs = 4;
  // Room for 1000 full blocks plus rings for 4 sequences.
  const uint64_t budget = 1000 * f + ring * max_seqs * s;
  auto n = BlocksForBudget(spec, bs, budget, max_seqs);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ((*n)[0], ring * max_seqs);
  EXPECT_EQ((*n)[1], 1000);

  // A small budget: both groups get the same N, the most that fits.
  const uint64_t small = 10 * (s + f) + s;
  n = BlocksForBudget(spec, bs, small, max_seqs);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ((*n)[0], 10);
  EXPECT_EQ((*n)[1], 10);
}

TEST(KvMemoryBudgetTest, OnlySlidingGroupsAreNotCapped) {
  const ModelCacheSpec spec = MakeSpec({32, 32});
  const uint64_t s = spec.BytesPerBlock(0, 16);
  auto n = BlocksForBudget(spec, 16, 500 * s, 1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, (std::vector<int32_t>{500}));
}

TEST(KvMemoryBudgetTest, TooSmallBudgetIsResourceExhausted) {
  const ModelCacheSpec spec = SlidingSpec(64);
  const uint64_t s = spec.BytesPerBlock(0, 16), f = spec.BytesPerBlock(1, 16);
  // Four blocks each: less than one ring (5 blocks).
  auto n = BlocksForBudget(spec, 16, 4 * (s + f));
  EXPECT_EQ(n.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(BlocksForBudget(FullSpec(), 16, 10).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(BlocksForBudget(FullSpec(), 0, 1 << 20).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlocksForBudget(ModelCacheSpec{}, 16, 1 << 20).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentkv::cache
