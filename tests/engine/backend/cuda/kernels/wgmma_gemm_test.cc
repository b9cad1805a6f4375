// The warpgroup GEMM (wgmma_gemm.cu) against the CPU Linear, plain, with
// the activation and with the argmax in its epilogue.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "engine/backend/cpu/cpu_kernels.h"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

// The warpgroup GEMM against the CPU Linear: row counts that leave part of
// the 64-row tile empty, both tile widths, K split 1-8 ways (the default
// plan and forced ones; the split counters must be back at zero for each
// next launch), fp32 output with the residual added and bf16 output; the
// same bits on a second run; and the gated-activation epilogue.
TEST(CudaKernels, WgmmaGemmMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(12);
  auto ws = Poisoned<float>(WgmmaGemmWorkspaceBytes(sms) / 4);
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.bytes()), cudaSuccess);
  const WgmmaGemmWorkspace wws{ws.get(), sms};
  struct Case {
    int m, n, k;
    WgmmaGemmPlan plan;
  };
  const std::vector<Case> cases = {{64, 3072, 2048, {}},
                                   {40, 2048, 8192, {}},
                                   {9, 16384, 2048, {}},
                                   {33, 2048, 2048, {}},
                                   {64, 192, 320, {64, 5}},
                                   {17, 256, 512, {128, 8}},
                                   {64, 512, 1024, {128, 2}},
                                   {50, 512, 4096, {64, 2}},
                                   {24, 384, 2048, {128, 4}},
                                   {64, 512, 4096, {64, 2, true}},
                                   {24, 384, 2048, {128, 4, true}},
                                   {40, 256, 1024, {64, 1, true}},
                                   {1, 128, 64, {64, 1}}};
  for (const Case& c : cases) {
    const int m = c.m, n = c.n, k = c.k;
    ASSERT_TRUE(WgmmaGemmSupported(m, n, k));
    for (const bool f32 : {true, false})
      CheckGemmAgainstLinear(
          m, n, k, f32, rng,
          std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) + " tile " +
              std::to_string(c.plan.tile) + " splits " + std::to_string(c.plan.splits),
          [&](const bf16_t* x, const bf16_t* w, void* y, float beta) {
            return LaunchWgmmaGemm(x, w, y, f32, m, n, k, beta, wws, nullptr, -1, false, c.plan);
          });
  }
  // The gated activation in the epilogue, with and without split K: against
  // Linear then the CPU GatedActivation.
  for (auto [m, n, k, splits] : {std::array{64, 8192, 2048, 1}, std::array{9, 8192, 2048, 1},
                                 std::array{33, 512, 1024, 4}, std::array{64, 96, 2048, 3}})
    for (model::Activation act : {model::Activation::kSilu, model::Activation::kGeluTanh}) {
      const auto x = Rounded(Random(m * k, rng));
      const auto w = Rounded(Random(static_cast<size_t>(2 * n) * k, rng, 0.05f));
      auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(InterleaveGateUp(w, n, k)));
      auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
      ASSERT_EQ(LaunchWgmmaGemm(dx.get<bf16_t>(), dw.get<bf16_t>(), out.get(), false, m, 2 * n, k,
                                0.f, wws, nullptr, act == model::Activation::kSilu ? 0 : 1, false,
                                {64, splits, true}),
                cudaSuccess);
      ExpectLinearThenGated(out, x, w, m, n, k, act);
    }
  EXPECT_EQ(LaunchWgmmaGemm(nullptr, nullptr, nullptr, true, 64, 128, 128, 0.f, wws, nullptr, 0),
            cudaErrorInvalidValue);  // the activation writes bf16
  const WgmmaGemmPlan o = WgmmaGemmPlanFor(2048, 2048, 132);
  EXPECT_EQ(o.tile, 64);
  EXPECT_GT(o.splits, 1);
  EXPECT_EQ(WgmmaGemmPlanFor(128256, 2048, 132).splits, 1);
  EXPECT_FALSE(WgmmaGemmSupported(kMaxWgmmaRows + 1, 2048, 2048));
  EXPECT_FALSE(WgmmaGemmSupported(64, 2048, 2080));
  EXPECT_FALSE(WgmmaGemmSupported(64, 200, 2048));
  EXPECT_EQ(LaunchWgmmaGemm(nullptr, nullptr, nullptr, true, 64, 192, 320, 0.f, wws, nullptr, -1,
                            false, {128, 1}),
            cudaErrorInvalidValue);  // 192 features are not whole 128-wide tiles
  EXPECT_EQ(LaunchWgmmaGemm(nullptr, nullptr, nullptr, true, 64, 16384, 2048, 0.f, wws, nullptr, -1,
                            false, {64, 16}),
            cudaErrorInvalidValue);  // 4,096 partial tiles: more than the workspace holds
  EXPECT_EQ(LaunchWgmmaGemm(nullptr, nullptr, nullptr, false, 64, 2048, 2048, 0.f, wws, nullptr, -1,
                            true),
            cudaErrorInvalidValue);  // planes are fp32
}

// The LM head's warpgroup GEMM with the argmax in its epilogue: the same
// index as LaunchArgmax over the logits (exact), ties across and within
// tiles going to the lower index, rows past m ignored; the logits stored
// (the same bits as the plain GEMM) when the device flag is 1 or absent, and
// not touched when it is 0.
TEST(CudaKernels, WgmmaGemmArgmaxMatchesArgmaxOfLogits) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(21);
  auto ws = Poisoned<float>(WgmmaGemmWorkspaceBytes(sms) / 4);
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.bytes()), cudaSuccess);
  struct Case {
    int m, n, k;
    WgmmaGemmPlan plan;
  };
  for (const Case& c : {Case{64, 64 * 37, 256, {}}, Case{17, 128 * 19, 512, {128, 1, true}},
                        Case{3, 64 * 40, 128, {64, 1}}}) {
    const int m = c.m, n = c.n, k = c.k;
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k);
    const auto x = Rounded(Random(m * k, rng));
    auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    // Row 0's best twice, in different tiles (100 and n - 5); row 1's
    // twice in one tile (5 and 40): the lower index must win.
    auto align = [&](int row, int feature) {
      for (int i = 0; i < k; ++i)
        w[static_cast<size_t>(feature) * k + i] = x[row * k + i] > 0 ? 0.5f : -0.5f;
    };
    align(0, 100);
    align(0, n - 5);
    align(1, 5);
    align(1, 40);
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
    cuda::DeviceBuffer scratch, ref_scratch, flag;
    ASSERT_TRUE(scratch.Allocate(WgmmaArgmaxScratchBytes(m, n, c.plan)).ok());
    ASSERT_TRUE(ref_scratch.Allocate(ArgmaxScratchBytes(m)).ok());
    ASSERT_TRUE(flag.Allocate(4).ok());
    // The plain GEMM's logits and their two-pass argmax: the reference.
    auto plain = Poisoned<float>(static_cast<size_t>(m) * n);
    auto ref_picks = Poisoned<int32_t>(m);
    ASSERT_EQ(LaunchWgmmaGemm(dx.get<bf16_t>(), dw.get<bf16_t>(), plain.get(), true, m, n, k, 0.f,
                              {ws.get(), sms}, nullptr, -1, false, c.plan),
              cudaSuccess);
    ASSERT_EQ(LaunchArgmax(plain.get<float>(), m, n, ref_picks.get<int32_t>(), ref_scratch.get(),
                           nullptr),
              cudaSuccess);
    const auto want_logits = Download<float>(plain, static_cast<size_t>(m) * n);
    const auto want = Download<int32_t>(ref_picks, m);
    EXPECT_EQ(want[0], 100) << what;
    EXPECT_EQ(want[1], 5) << what;
    for (int store : {1, 0, -1}) {  // -1: no flag (always stored)
      const int32_t v = store;
      ASSERT_EQ(cudaMemcpy(flag.get(), &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
      auto logits = Poisoned<float>(static_cast<size_t>(m) * n);
      auto picks = Poisoned<int32_t>(m);
      ASSERT_EQ(LaunchWgmmaGemmArgmax(dx.get<bf16_t>(), dw.get<bf16_t>(), logits.get<float>(),
                                      store < 0 ? nullptr : flag.get<int32_t>(), m, n, k,
                                      scratch.get(), picks.get<int32_t>(), sms, nullptr, c.plan),
                cudaSuccess)
          << what;
      EXPECT_EQ(Download<int32_t>(picks, m), want) << what << " store " << store;
      const auto got = Download<float>(logits, static_cast<size_t>(m) * n);
      if (store != 0) {
        EXPECT_EQ(0, std::memcmp(got.data(), want_logits.data(), got.size() * 4)) << what;
      } else {
        EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float f) { return std::isnan(f); }))
            << what << ": logits written although the flag was 0";
      }
    }
  }
  cuda::DeviceBuffer any;
  ASSERT_TRUE(any.Allocate(1 << 20).ok());
  EXPECT_EQ(LaunchWgmmaGemmArgmax(nullptr, nullptr, nullptr, nullptr, 64, 2048, 2048, any.get(),
                                  any.get<int32_t>(), sms, nullptr, {64, 2}),
            cudaErrorInvalidValue);  // no split K
  EXPECT_EQ(LaunchWgmmaGemmArgmax(nullptr, nullptr, nullptr, nullptr, 64, 2048, 2048, nullptr,
                                  any.get<int32_t>(), sms, nullptr),
            cudaErrorInvalidValue);  // no scratch
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
