// PlanRestore: the split between recomputing a head and loading the rest,
// against an exhaustive search over every split, and its limits.
#include "engine/restore_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace agentkv::engine {
namespace {

// The model's time for recomputing r blocks and loading the rest.
double Cost(const RestoreRates& in, int64_t r) {
  const double busy = std::max(1.0, in.gpu_busy_factor);
  const int64_t a = in.cached_blocks * in.block_size;
  const double c = r > 0 ? busy * in.prefill.Seconds(a, a + r * in.block_size) : 0;
  const double l = r < in.prefix_blocks
                       ? in.tier_latency_s + (in.prefix_blocks - r) *
                                                 static_cast<double>(in.bytes_per_block) /
                                                 in.tier_bytes_per_s
                       : 0;
  return std::max(c, l);
}

// `prefill`: tokens per second with no context; attention adds
// `context` (seconds per token per token before it).
RestoreRates Rates(int64_t blocks, double prefill, double tier, size_t block_bytes, double busy = 1,
                   double context = 0, int64_t cached = 0) {
  RestoreRates r;
  r.cached_blocks = cached;
  r.prefix_blocks = blocks;
  r.block_size = 16;
  if (prefill > 0) r.prefill.seconds_per_token = 1 / prefill;
  r.prefill.seconds_per_token_context = context;
  r.tier_bytes_per_s = tier;
  r.bytes_per_block = block_bytes;
  r.gpu_busy_factor = busy;
  return r;
}

TEST(RestorePolicyTest, MatchesTheBestSplitAndNeverLosesToAPureStrategy) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> blocks(1, 3000);
  std::uniform_real_distribution<double> log_prefill(2.5, 5.5);  // 300 .. 300k tok/s
  std::uniform_real_distribution<double> log_tier(8.0, 10.7);    // 100 MB/s .. 50 GB/s
  std::uniform_int_distribution<int> block_kib(16, 4096);
  std::uniform_real_distribution<double> busy(1.0, 4.0);
  std::uniform_real_distribution<double> log_context(-13, -8);
  std::uniform_int_distribution<int64_t> cached(0, 2000);
  for (int i = 0; i < 300; ++i) {
    RestoreRates in =
        Rates(blocks(rng), std::pow(10.0, log_prefill(rng)), std::pow(10.0, log_tier(rng)),
              static_cast<size_t>(block_kib(rng)) * 1024, busy(rng),
              i % 3 == 0 ? 0 : std::pow(10.0, log_context(rng)), i % 2 == 0 ? 0 : cached(rng));
    if (i % 4 == 1) in.tier_latency_s = std::pow(10.0, log_context(rng) + 8);  // 0.1 ms .. 1 s
    const RestorePlan p = PlanRestore(in);
    ASSERT_EQ(p.recompute_blocks + p.load_blocks, in.prefix_blocks);
    double best = Cost(in, 0);
    for (int64_t r = 1; r <= in.prefix_blocks; ++r) best = std::min(best, Cost(in, r));
    EXPECT_NEAR(p.seconds, Cost(in, p.recompute_blocks), 1e-12);
    EXPECT_LE(p.seconds, best * (1 + 1e-9)) << i;
    EXPECT_NEAR(p.load_all_seconds, Cost(in, 0), 1e-12);
    EXPECT_NEAR(p.recompute_all_seconds, Cost(in, in.prefix_blocks), 1e-12);
    EXPECT_LE(p.seconds, 1.1 * std::min(p.load_all_seconds, p.recompute_all_seconds));
  }
}

TEST(RestorePolicyTest, BothFinishTogetherWhenTheyAreComparable) {
  // 20k tokens of a 1B shape (32 KiB a token: 512 KiB a block): prefill
  // re-does them in 0.21 s, the store delivers them in 0.50 s.
  const int64_t n = 20480 / 16;
  const size_t bb = 512 * 1024;
  const RestoreRates in = Rates(n, 20480 / 0.21, n * static_cast<double>(bb) / 0.50, bb);
  const RestorePlan p = PlanRestore(in);
  EXPECT_GT(p.recompute_blocks, 0);
  EXPECT_GT(p.load_blocks, 0);
  EXPECT_LT(p.seconds, p.recompute_all_seconds);
  EXPECT_LT(p.seconds, p.load_all_seconds);
  // Balanced to within one block of either side.
  const double per_token = in.prefill.seconds_per_token;
  const double c = p.recompute_blocks * 16 * per_token;
  const double l = p.load_blocks * static_cast<double>(bb) / in.tier_bytes_per_s;
  EXPECT_LE(std::abs(c - l), std::max(16 * per_token, bb / in.tier_bytes_per_s));
}

TEST(RestorePolicyTest, AttentionMakesLaterBlocksDearerToRecompute) {
  // The same prefix after 4k cached tokens: recomputing it costs more than
  // at the start of the context, so less of it is recomputed.
  const size_t bb = 2 << 20;
  const RestoreRates start = Rates(2048, 20000, 2e9, bb, 1, 2e-9, 0);
  const RestoreRates later = Rates(2048, 20000, 2e9, bb, 1, 2e-9, 4096 / 16 * 16);
  EXPECT_LT(PlanRestore(later).recompute_blocks, PlanRestore(start).recompute_blocks);
  EXPECT_GT(PlanRestore(later).recompute_blocks, 0);
}

TEST(RestorePolicyTest, AShortPromptIsRecomputedWhenTheTierIsSlowToStart) {
  // 4k tokens of the 1B shape on an H200: recomputing all takes 16.5 ms;
  // the store would take 20 ms before its first block.
  RestoreRates in = Rates(256, 1 / 3.19e-6, 2e9, 512 * 1024, 1, 4.15e-10);
  in.tier_latency_s = 0.020;
  const RestorePlan p = PlanRestore(in);
  EXPECT_EQ(p.recompute_blocks, 256);
  EXPECT_EQ(p.load_blocks, 0);
  in.tier_latency_s = 0;
  EXPECT_LT(PlanRestore(in).recompute_blocks, 256);
}

TEST(RestorePolicyTest, PrefillCostFromTwoTimedChunks) {
  // 2048 tokens take 0.10 s at the start and 0.26 s after 16k tokens.
  const PrefillCost c = PrefillCost::FromTimings(2048, 0.10, 16384, 0.26);
  ASSERT_TRUE(c.known());
  EXPECT_NEAR(c.Seconds(0, 2048), 0.10, 1e-9);
  EXPECT_NEAR(c.Seconds(16384, 16384 + 2048), 0.26, 1e-9);
  EXPECT_NEAR(c.Seconds(0, 4096), c.Seconds(0, 2048) + c.Seconds(2048, 4096), 1e-12);
  // Noise that makes the later chunk faster means no context term.
  const PrefillCost flat = PrefillCost::FromTimings(2048, 0.10, 16384, 0.09);
  EXPECT_EQ(flat.seconds_per_token_context, 0);
  EXPECT_NEAR(flat.Seconds(0, 2048), 0.10, 1e-9);
  EXPECT_FALSE(PrefillCost::FromTimings(0, 0.1, 16, 0.2).known());
  EXPECT_FALSE(PrefillCost::FromTimings(2048, 0, 16, 0.2).known());
  EXPECT_FALSE(PrefillCost::FromTimings(2048, 0.1, 0, 0.2).known());
  EXPECT_EQ(c.Seconds(10, 10), 0);
}

TEST(RestorePolicyTest, ABusierDeviceRecomputesLess) {
  const size_t bb = 512 * 1024;
  const RestoreRates idle = Rates(1000, 100000, 4e9, bb, 1);
  const RestoreRates busy = Rates(1000, 100000, 4e9, bb, 3);
  EXPECT_LT(PlanRestore(busy).recompute_blocks, PlanRestore(idle).recompute_blocks);
  EXPECT_GT(PlanRestore(idle).recompute_blocks, 0);
}

TEST(RestorePolicyTest, CpuRatesLoadEverything) {
  // A CPU prefills about a thousand tokens a second and copies GB/s.
  const RestorePlan p = PlanRestore(Rates(500, 1000, 5e9, 96 * 1024));
  EXPECT_EQ(p.recompute_blocks, 0);
  EXPECT_EQ(p.load_blocks, 500);
  EXPECT_DOUBLE_EQ(p.seconds, p.load_all_seconds);
}

TEST(RestorePolicyTest, UnknownOrUnusableRatesFallBackToAPureStrategy) {
  RestorePlan p = PlanRestore(Rates(40, 0, 1e9, 4096));  // prefill rate unknown
  EXPECT_EQ(p.recompute_blocks, 0);
  EXPECT_EQ(p.load_blocks, 40);
  p = PlanRestore(Rates(40, 5000, 0, 4096));  // the tier delivers nothing
  EXPECT_EQ(p.recompute_blocks, 40);
  EXPECT_EQ(p.load_blocks, 0);
  EXPECT_TRUE(std::isfinite(p.seconds));
  p = PlanRestore(Rates(0, 5000, 1e9, 4096));
  EXPECT_EQ(p.recompute_blocks + p.load_blocks, 0);
  EXPECT_EQ(p.seconds, 0);
  // A busy factor below 1 counts as an idle device.
  EXPECT_EQ(PlanRestore(Rates(100, 1e5, 4e9, 1 << 19, 0.2)).recompute_blocks,
            PlanRestore(Rates(100, 1e5, 4e9, 1 << 19, 1)).recompute_blocks);
}

}  // namespace
}  // namespace agentkv::engine
