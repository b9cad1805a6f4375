// The MoE kernels' decisions (moe_plan.h) on the host: no GPU and no CUDA
// toolkit needed. Routing against the CPU backend's kernels::RouteTopK;
// the grouping against a plain sort of the assignments.
#include "engine/backend/cuda/kernels/moe_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "engine/backend/cpu/cpu_moe.h"

namespace agentkv::backend::cuda {
namespace {

// Random logits, some repeated (ties must go to the lower id, as on the
// CPU), in both routings, with and without renormalisation.
TEST(MoePlan, RouteTokenMatchesTheCpuReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int E : {4, 32, 128})
    for (int k : {1, 2, 4, 8}) {
      if (k > E) continue;
      for (int trial = 0; trial < 50; ++trial) {
        std::vector<float> logits(E);
        for (float& x : logits) x = nd(rng);
        // Ties: a few logits copied from others (the max among them too).
        for (int i = 0; i < trial % 4; ++i) logits[rng() % E] = logits[rng() % E];
        if (trial % 5 == 0) logits[E - 1] = *std::max_element(logits.begin(), logits.end());
        for (int mode = 0; mode < 3; ++mode) {
          const model::MoeRouting routing =
              mode == 0 ? model::MoeRouting::kTopKThenSoftmax : model::MoeRouting::kSoftmaxThenTopK;
          const bool renorm = mode == 2;
          std::vector<int32_t> want_e(k), got_e(k);
          std::vector<float> want_w(k), got_w(k);
          cpu::kernels::RouteTopK(logits.data(), E, k, routing, renorm, want_e.data(),
                                  want_w.data());
          kernels::MoeRouteToken(logits.data(), E, k,
                                 routing == model::MoeRouting::kSoftmaxThenTopK, renorm,
                                 got_e.data(), got_w.data());
          EXPECT_EQ(got_e, want_e) << "E " << E << " k " << k << " mode " << mode;
          for (int j = 0; j < k; ++j)
            EXPECT_NEAR(got_w[j], want_w[j], 1e-6f * std::max(1.f, want_w[j]))
                << "E " << E << " k " << k << " mode " << mode << " slot " << j;
        }
      }
    }
}

TEST(MoePlan, RouteTokenSkipsNaN) {
  const std::vector<float> logits = {NAN, 1.f, 3.f, NAN, 2.f};
  int32_t e[2];
  float w[2];
  kernels::MoeRouteToken(logits.data(), 5, 2, false, false, e, w);
  EXPECT_EQ(e[0], 2);
  EXPECT_EQ(e[1], 4);
  EXPECT_NEAR(w[0], 1.f / (1.f + std::exp(-1.f)), 1e-6f);
  EXPECT_NEAR(w[0] + w[1], 1.f, 1e-6f);
}

// Grouping: every assignment appears once, in its expert's range, tokens
// ascending within it; slot_of inverts order; the tiles cover each group.
TEST(MoePlan, GroupsAssignmentsByExpert) {
  std::mt19937 rng(9);
  for (int E : {1, 8, 32, 128})
    for (int A : {0, 1, 7, 64, 1000}) {
      std::vector<int32_t> experts(A);
      // Skewed: half the assignments to expert 0, some experts empty.
      for (int32_t& e : experts) e = rng() % 2 ? 0 : static_cast<int32_t>(rng() % E);
      std::vector<int32_t> offsets(E + 1), tiles(E + 1), order(A, -1), slot_of(A, -1);
      kernels::MoePlanOffsets(experts.data(), A, E, offsets.data());
      for (int e = 0; e < E; ++e)
        kernels::MoePlanExpert(e, experts.data(), A, offsets.data(), order.data(), slot_of.data());
      kernels::MoePlanTiles(offsets.data(), E, tiles.data());
      ASSERT_EQ(offsets[0], 0);
      ASSERT_EQ(offsets[E], A);
      // The reference: assignments stably sorted by expert.
      std::vector<int32_t> want(A);
      for (int a = 0; a < A; ++a) want[a] = a;
      std::stable_sort(want.begin(), want.end(),
                       [&](int32_t x, int32_t y) { return experts[x] < experts[y]; });
      EXPECT_EQ(order, want) << "E " << E << " A " << A;
      for (int a = 0; a < A; ++a) {
        ASSERT_GE(slot_of[a], 0);
        EXPECT_EQ(order[slot_of[a]], a);
        const int e = experts[a];
        EXPECT_GE(slot_of[a], offsets[e]);
        EXPECT_LT(slot_of[a], offsets[e + 1]);
      }
      // Tiles: each tile names its expert and a first row inside the group;
      // together they cover every row once.
      ASSERT_LE(tiles[E], kernels::MoeMaxTiles(A, E));
      std::vector<int> covered(A, 0);
      for (int b = 0; b < kernels::MoeMaxTiles(A, E) + 2; ++b) {
        int row0 = -1;
        const int e = kernels::MoeTileExpert(b, tiles.data(), offsets.data(), E, &row0);
        if (b >= tiles[E]) {
          EXPECT_EQ(e, -1) << b;
          continue;
        }
        ASSERT_GE(e, 0);
        ASSERT_GE(row0, offsets[e]);
        ASSERT_LT(row0, offsets[e + 1]);
        for (int r = row0;
             r < std::min(row0 + kernels::kMoeTileRows, static_cast<int>(offsets[e + 1])); ++r)
          ++covered[r];
      }
      for (int r = 0; r < A; ++r) EXPECT_EQ(covered[r], 1) << "row " << r;
    }
}

TEST(MoePlan, MaxTilesBoundsEveryGrouping) {
  // Worst case: every expert's group one row past a whole tile.
  const int E = 8, A = E * (kernels::kMoeTileRows + 1);
  std::vector<int32_t> experts(A);
  for (int a = 0; a < A; ++a) experts[a] = a % E;
  std::vector<int32_t> offsets(E + 1), tiles(E + 1);
  kernels::MoePlanOffsets(experts.data(), A, E, offsets.data());
  kernels::MoePlanTiles(offsets.data(), E, tiles.data());
  EXPECT_EQ(tiles[E], 2 * E);
  EXPECT_LE(tiles[E], kernels::MoeMaxTiles(A, E));
  EXPECT_EQ(kernels::MoeMaxTiles(0, E), 0);
}

// The grouped GEMM's kernel: decode-sized steps and sparse groupings on
// the GEMV, dense ones on the tensor cores, in every format; quantized
// weights nowhere when no kernel can read the shape.
TEST(MoePlan, ChoosesTheGemmPath) {
  constexpr auto kBf16 = kernels::MoeWeightFormat::kBf16;
  constexpr auto kFp8 = kernels::MoeWeightFormat::kFp8Block;
  constexpr auto kMx = kernels::MoeWeightFormat::kMxfp4;
  // Qwen3-30B-A3B's gate_up (N 1536, K 2048) and down (N 2048, K 768).
  for (auto [N, K] : {std::pair{1536, 2048}, std::pair{2048, 768}}) {
    EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 8, 128, N, K, kBf16), kernels::MoeGemmPath::kGemv);
    EXPECT_EQ(kernels::ChooseMoeGemmPath(kernels::kMoeGemvTokens, 8, 128, N, K, kBf16),
              kernels::MoeGemmPath::kGemv);
    // 64 tokens x 8 over 128 experts: 4 rows per expert on average, where
    // the tiles measured faster.
    EXPECT_EQ(kernels::ChooseMoeGemmPath(64, 8, 128, N, K, kBf16),
              kernels::MoeGemmPath::kTensorCores);
    EXPECT_EQ(kernels::ChooseMoeGemmPath(kernels::kMoeGemvTokens + 1, 8, 128, N, K, kBf16),
              kernels::MoeGemmPath::kTensorCores);
    // 512 tokens: 32 per expert.
    EXPECT_EQ(kernels::ChooseMoeGemmPath(512, 8, 128, N, K, kBf16),
              kernels::MoeGemmPath::kTensorCores);
    EXPECT_EQ(kernels::ChooseMoeGemmPath(512, 8, 128, N, K, kFp8),
              kernels::MoeGemmPath::kTensorCores);
    EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 8, 128, N, K, kFp8), kernels::MoeGemmPath::kGemv);
  }
  // The token boundary on a small shape too.
  EXPECT_EQ(kernels::ChooseMoeGemmPath(kernels::kMoeGemvTokens, 2, 8, 64, 64, kBf16),
            kernels::MoeGemmPath::kGemv);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(kernels::kMoeGemvTokens + 1, 2, 8, 64, 64, kBf16),
            kernels::MoeGemmPath::kTensorCores);
  // GPT-OSS-20B's experts in MXFP4 (K 2880 = 90 blocks).
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 4, 32, 5760, 2880, kMx), kernels::MoeGemmPath::kGemv);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(4096, 4, 32, 5760, 2880, kMx),
            kernels::MoeGemmPath::kTensorCores);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(64, 4, 32, 5760, 2880, kMx),
            kernels::MoeGemmPath::kTensorCores);
  // Past the GEMV's K: the tiles, which take quantized weights too.
  EXPECT_EQ(kernels::ChooseMoeGemmPath(16, 4, 32, 64, kernels::kMaxMoeGemvK + 32, kMx),
            kernels::MoeGemmPath::kTensorCores);
  // Fewer rows per pass leave room for longer rows: a one-token step of
  // Qwen3-8B's down projection (K 12,288) on the GEMV.
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 1, 1, 4096, 12288, kFp8), kernels::MoeGemmPath::kGemv);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(16, 1, 1, 4096, 12288, kFp8),
            kernels::MoeGemmPath::kTensorCores);
  // Shapes the GEMV cannot read: bf16 goes to the tiles, quantized nowhere.
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 4, 32, 64, 130, kBf16),
            kernels::MoeGemmPath::kTensorCores);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(16, 4, 32, 64, kernels::kMaxMoeGemvK + 8, kBf16),
            kernels::MoeGemmPath::kTensorCores);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 4, 32, 64, 48, kMx), kernels::MoeGemmPath::kUnsupported);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 4, 32, 64, 40, kFp8), kernels::MoeGemmPath::kUnsupported);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(0, 4, 32, 64, 64, kBf16),
            kernels::MoeGemmPath::kUnsupported);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 4, 32, 0, 64, kBf16), kernels::MoeGemmPath::kUnsupported);
}

// CudaTuning::moe_gemv off: the tiles wherever they take the shape.
TEST(MoePlan, GemvOffTakesTheTiles) {
  EXPECT_EQ(
      kernels::ChooseMoeGemmPath(1, 8, 128, 1536, 2048, kernels::MoeWeightFormat::kBf16, false),
      kernels::MoeGemmPath::kTensorCores);
  EXPECT_EQ(
      kernels::ChooseMoeGemmPath(1, 4, 32, 5760, 2880, kernels::MoeWeightFormat::kMxfp4, false),
      kernels::MoeGemmPath::kTensorCores);
  EXPECT_EQ(kernels::ChooseMoeGemmPath(1, 4, 32, 64, 48, kernels::MoeWeightFormat::kMxfp4, false),
            kernels::MoeGemmPath::kUnsupported);
}

TEST(MoePlan, GemvPassRows) {
  EXPECT_EQ(kernels::MoeGemvPassRows(1), 1);
  EXPECT_EQ(kernels::MoeGemvPassRows(2), 2);
  EXPECT_EQ(kernels::MoeGemvPassRows(3), 4);
  EXPECT_EQ(kernels::MoeGemvPassRows(5), 8);
  EXPECT_EQ(kernels::MoeGemvPassRows(64), kernels::kMaxMoeGemvRows);
  EXPECT_EQ(kernels::MoeGemvPassRows(0), kernels::kMaxMoeGemvRows);  // unknown
  EXPECT_TRUE(kernels::MoeGemvTakes(16, 32, kernels::MoeWeightFormat::kMxfp4));
  EXPECT_FALSE(kernels::MoeGemvTakes(16, 16, kernels::MoeWeightFormat::kMxfp4));
  EXPECT_TRUE(kernels::MoeGemvTakes(16, 16, kernels::MoeWeightFormat::kFp8Block));
  EXPECT_FALSE(kernels::MoeGemvTakes(16, 8, kernels::MoeWeightFormat::kFp8Block));
  EXPECT_TRUE(kernels::MoeGemvTakes(16, 8, kernels::MoeWeightFormat::kBf16));
  // x's rows of a pass in shared memory: K x rows per pass bounded.
  EXPECT_TRUE(kernels::MoeGemvTakes(16, kernels::kMaxMoeGemvK, kernels::MoeWeightFormat::kBf16));
  EXPECT_FALSE(
      kernels::MoeGemvTakes(16, kernels::kMaxMoeGemvK + 8, kernels::MoeWeightFormat::kBf16));
  EXPECT_TRUE(
      kernels::MoeGemvTakes(16, 8 * kernels::kMaxMoeGemvK, kernels::MoeWeightFormat::kFp8Block, 1));
  EXPECT_FALSE(
      kernels::MoeGemvTakes(16, 8 * kernels::kMaxMoeGemvK, kernels::MoeWeightFormat::kFp8Block, 2));
}

}  // namespace
}  // namespace agentkv::backend::cuda
