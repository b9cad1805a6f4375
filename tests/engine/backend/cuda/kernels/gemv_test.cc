// The decode GEMVs (gemv.cu), plain and with the norm or the activation
// fused, against the CPU Linear, RmsNorm and GatedActivation.
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
#include "engine/backend/cuda/kernels/gemv.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

// The GEMV with the activation in its epilogue against Linear, then the
// CPU GatedActivation, on weights whose gate and up rows are interleaved.
TEST(CudaKernels, GemvGatedActMatchesLinearThenActivation) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (int m = 1; m <= kMaxGemvActRows; ++m)
    for (auto [n, k] : {std::pair{16384, 2048}, std::pair{1000, 4096}, std::pair{74, 264}})
      for (model::Activation a : {model::Activation::kSilu, model::Activation::kGeluTanh}) {
        ASSERT_TRUE(GemvGatedActSupported(m, 2 * n, k));
        const auto x = Rounded(Random(m * k, rng));
        // [gate rows | up rows], the layout of the CPU reference.
        const auto w = Rounded(Random(static_cast<size_t>(2 * n) * k, rng, 0.05f));
        auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(InterleaveGateUp(w, n, k)));
        auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
        ASSERT_EQ(LaunchGemvGatedAct(dx.get<bf16_t>(), dw.get<bf16_t>(), out.get<bf16_t>(), m,
                                     2 * n, k, a == model::Activation::kSilu ? 0 : 1, nullptr),
                  cudaSuccess);
        ExpectLinearThenGated(out, x, w, m, n, k, a);
      }
  EXPECT_FALSE(GemvGatedActSupported(kMaxGemvActRows + 1, 16384, 2048));
  EXPECT_FALSE(GemvGatedActSupported(1, 1001, 2048));  // odd: not whole pairs
}

TEST(CudaKernels, GemvMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (int m = 1; m <= kMaxGemvRows; ++m) {
    // (k >= 8192: the pipelined kernel, 8,456 ending in a partial stage.)
    for (auto [n, k] :
         {std::pair{3072, 2048}, std::pair{2048, 8192}, std::pair{37, 264}, std::pair{300, 8456}}) {
      if (!GemvSupported(m, k)) continue;
      // pipe false: every shape on the plain kernel (CudaTuning::gemv_pipe).
      for (bool f32 : {true, false})
        for (bool pipe : {true, false}) {
          const auto x = Rounded(Random(m * k, rng)),
                     w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
          const auto y0 = Rounded(Random(m * n, rng));
          auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
          cuda::DeviceBuffer dy = f32 ? Upload(y0) : Upload(Bf16Of(y0));
          const float beta = f32 ? 1.f : 0.f;
          ASSERT_EQ(LaunchGemv(dx.get<bf16_t>(), dw.get<bf16_t>(), dy.get(), f32, m, n, k, beta,
                               132, nullptr, pipe),
                    cudaSuccess);
          std::vector<float> ref(m * n);
          cpu::kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
          for (int i = 0; i < m * n; ++i) ref[i] += beta * y0[i];
          const auto got = f32 ? Download<float>(dy, m * n) : DownloadBf16(dy, m * n);
          EXPECT_LT(RelErr(got, ref), f32 ? 1e-5 : 1e-2)
              << m << " " << n << " " << k << " pipe " << pipe;
        }
    }
  }
}

// The MLP's norm, gate_up GEMV and activation in one (pipelined) kernel
// against the CPU RmsNorm, Linear and GatedActivation; shapes whose rows
// leave warps idle (74 pairs) and end in a partial stage (k = 2,312).
TEST(CudaKernels, NormGemvGatedActMatchesNormLinearActivation) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(13);
  for (int m = 1; m <= kMaxNormGemvRows; ++m)
    for (auto [n, k] : {std::pair{8192, 2048}, std::pair{1000, 4096}, std::pair{74, 2312}})
      for (bool plus_one : {false, true}) {
        const model::Activation a =
            plus_one ? model::Activation::kGeluTanh : model::Activation::kSilu;
        ASSERT_TRUE(NormGemvGatedActSupported(m, 2 * n, k));
        const auto x = Random(m * k, rng, 2.f);
        const auto nw = Random(k, rng, 0.2f, plus_one ? 0.f : 1.f);
        const auto w = Rounded(Random(static_cast<size_t>(2 * n) * k, rng, 0.05f));
        auto dx = Upload(x), dnw = Upload(nw), dw = Upload(Bf16Of(InterleaveGateUp(w, n, k)));
        auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
        ASSERT_EQ(LaunchNormGemvGatedAct(dx.get<float>(), dnw.get<float>(), 1e-6f, plus_one,
                                         dw.get<bf16_t>(), out.get<bf16_t>(), m, 2 * n, k,
                                         a == model::Activation::kSilu ? 0 : 1, nullptr),
                  cudaSuccess);
        std::vector<float> h(m * k);
        cpu::kernels::RmsNorm(x.data(), nw.data(), h.data(), m, k, 1e-6f, plus_one);
        h = Rounded(h);  // the GEMV reads the normalised rows as bf16
        ExpectLinearThenGated(out, h, w, m, n, k, a);
      }
  EXPECT_FALSE(NormGemvGatedActSupported(kMaxNormGemvRows + 1, 16384, 2048));
  EXPECT_FALSE(NormGemvGatedActSupported(1, 1001, 2048));   // odd: not whole pairs
  EXPECT_FALSE(NormGemvGatedActSupported(1, 16384, 8192));  // x in registers: k <= 4096
}

// RMSNorm of fp32 rows fused into the GEMV: the same as RmsNorm (bf16
// output) followed by Linear, for rows split over 1, 2 and 4 warps.
TEST(CudaKernels, NormGemvMatchesNormThenLinear) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(9);
  for (int m = 1; m <= kMaxNormGemvRows; ++m) {
    for (auto [n, k] :
         {std::pair{3072, 2048}, std::pair{1000, 4096}, std::pair{512, 2560}, std::pair{37, 264}}) {
      for (bool plus_one : {false, true}) {
        const auto x = Random(m * k, rng, 2.f);
        const auto nw = Random(k, rng, 0.2f, plus_one ? 0.f : 1.f);
        const auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
        auto dx = Upload(x), dnw = Upload(nw), dw = Upload(Bf16Of(w));
        auto dy = Poisoned<float>(m * n);
        ASSERT_EQ(LaunchNormGemv(dx.get<float>(), dnw.get<float>(), 1e-6f, plus_one,
                                 dw.get<bf16_t>(), dy.get(), true, m, n, k, 0.f, nullptr),
                  cudaSuccess);
        std::vector<float> h(m * k), ref(m * n);
        cpu::kernels::RmsNorm(x.data(), nw.data(), h.data(), m, k, 1e-6f, plus_one);
        h = Rounded(h);  // the GEMV reads the normalised rows as bf16
        cpu::kernels::Linear(h.data(), w.data(), nullptr, ref.data(), m, n, k);
        EXPECT_LT(RelErr(Download<float>(dy, m * n), ref), 5e-3) << m << " " << n << " " << k;
      }
    }
  }
  EXPECT_FALSE(NormGemvSupported(kMaxNormGemvRows + 1, 2048));
  EXPECT_FALSE(NormGemvSupported(1, 8192));  // x is held in registers: K <= 4096
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
