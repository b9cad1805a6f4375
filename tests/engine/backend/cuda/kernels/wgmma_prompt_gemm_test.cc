// The persistent prompt GEMM (wgmma_prompt_gemm.cu) against the CPU
// Linear, GatedActivation and the argmax kernel.
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
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

// The prompt-step GEMM against the CPU Linear (bf16 out) and against Linear then the CPU
// GatedActivation (the gated form): token counts that leave the last 128-row tile part empty,
// feature tiles past one raster band (2,560 = 10 tiles), K ending mid-way through the stage ring,
// and grids of a few blocks so that each block takes several tiles. The row after the last is
// poisoned and must stay so; two launches give the same bits.
TEST(CudaKernels, PromptGemmMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(21);
  struct Case {
    int m, n, k, grid, act;  // act < 0: plain
  };
  const std::vector<Case> cases = {{300, 2560, 320, 7, -1},    {129, 512, 64, sms, -1},
                                   {1000, 768, 1024, sms, -1}, {1, 256, 128, 1, -1},
                                   {300, 2560, 320, 7, 0},     {129, 512, 448, 3, 1},
                                   {1000, 1024, 1024, sms, 0}};
  for (const Case& c : cases) {
    const int m = c.m, n = c.n, k = c.k;
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                             " grid " + std::to_string(c.grid) + " act " + std::to_string(c.act);
    ASSERT_TRUE(PromptGemmSupported(m, n, k)) << what;
    const auto x = Rounded(Random(static_cast<size_t>(m) * k, rng));
    const auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    const int out_n = c.act >= 0 ? n / 2 : n;
    std::vector<float> ref(static_cast<size_t>(m) * out_n);
    std::vector<uint16_t> wdev;
    if (c.act >= 0) {
      std::vector<float> gu(static_cast<size_t>(m) * n);
      cpu::kernels::Linear(x.data(), w.data(), nullptr, gu.data(), m, n, k);  // [gate | up] rows
      cpu::kernels::GatedActivation(
          gu.data(), ref.data(), m, n / 2,
          c.act == 0 ? model::Activation::kSilu : model::Activation::kGeluTanh);
      wdev = Bf16Of(InterleaveGateUp(w, n / 2, k));
    } else {
      cpu::kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
      wdev = Bf16Of(w);
    }
    auto dx = Upload(Bf16Of(x)), dw = Upload(wdev);
    std::vector<uint16_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      auto out = Poisoned<uint16_t>(static_cast<size_t>(m + 1) * out_n);
      ASSERT_EQ(LaunchPromptGemm(dx.get<bf16_t>(), dw.get<bf16_t>(), out.get<bf16_t>(), m, n, k,
                                 c.act, c.grid, nullptr),
                cudaSuccess)
          << what;
      const auto raw = Download<uint16_t>(out, static_cast<size_t>(m + 1) * out_n);
      EXPECT_EQ(std::count(raw.begin() + static_cast<size_t>(m) * out_n, raw.end(), 0xffff), out_n)
          << what << ": wrote past row m";
      std::vector<float> got(static_cast<size_t>(m) * out_n);
      for (size_t i = 0; i < got.size(); ++i) got[i] = FromBf16(raw[i]);
      EXPECT_LT(RelErr(got, ref), 1e-2) << what;
      if (rep == 0) {
        first = raw;
      } else {
        EXPECT_EQ(raw, first) << what;
      }
    }
  }
  EXPECT_FALSE(PromptGemmSupported(128, 384, 2048));  // not whole 256-feature tiles
  EXPECT_FALSE(PromptGemmSupported(128, 2048, 2080));
  EXPECT_EQ(LaunchPromptGemm(nullptr, nullptr, nullptr, 128, 384, 2048, -1, sms, nullptr),
            cudaErrorInvalidValue);
}

// The prompt GEMM's LM head form: its logits against the CPU Linear, its
// argmax the same index as LaunchArgmax over those logits (exact), with
// tied features (duplicate weight rows) in one tile and across tiles going
// to the lower index; with the device flag at 0 no logit is written.
TEST(CudaKernels, PromptGemmArgmaxMatchesArgmaxOfLogits) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(23);
  for (auto [m, n, k, grid] :
       {std::array{64, 2560, 256, sms}, std::array{130, 1024, 128, 5}, std::array{3, 512, 64, 2}}) {
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k);
    const auto x = Rounded(Random(static_cast<size_t>(m) * k, rng));
    auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    for (auto [dst, src] : {std::pair{11, 10}, std::pair{n - 1, 3}})  // ties
      std::copy_n(w.begin() + static_cast<size_t>(src) * k, k,
                  w.begin() + static_cast<size_t>(dst) * k);
    std::vector<float> ref(static_cast<size_t>(m) * n);
    cpu::kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
    cuda::DeviceBuffer scratch, scratch2;
    ASSERT_TRUE(scratch.Allocate(PromptArgmaxScratchBytes(m, n)).ok());
    ASSERT_TRUE(scratch2.Allocate(ArgmaxScratchBytes(m)).ok());
    auto picks = Poisoned<int32_t>(m), plain = Poisoned<int32_t>(m);
    auto y = Poisoned<float>(static_cast<size_t>(m) * n);
    ASSERT_EQ(LaunchPromptGemmArgmax(dx.get<bf16_t>(), dw.get<bf16_t>(), y.get<float>(), nullptr, m,
                                     n, k, scratch.get(), picks.get<int32_t>(), grid, nullptr),
              cudaSuccess)
        << what;
    EXPECT_LT(RelErr(Download<float>(y, ref.size()), ref), 1e-5) << what;
    ASSERT_EQ(LaunchArgmax(y.get<float>(), m, n, plain.get<int32_t>(), scratch2.get(), nullptr),
              cudaSuccess);
    const auto got = Download<int32_t>(picks, m);
    EXPECT_EQ(got, Download<int32_t>(plain, m)) << what;
    // A row whose best is a tied pair picks the lower index.
    for (int r = 0; r < m; ++r) {
      EXPECT_NE(got[r], 11) << what;
      EXPECT_NE(got[r], n - 1) << what;
    }
    // Flag 0: the same picks, the logits not touched.
    auto flag = Upload(std::vector<int32_t>{0});
    auto y2 = Poisoned<float>(static_cast<size_t>(m) * n);
    auto picks2 = Poisoned<int32_t>(m);
    ASSERT_EQ(LaunchPromptGemmArgmax(dx.get<bf16_t>(), dw.get<bf16_t>(), y2.get<float>(),
                                     flag.get<int32_t>(), m, n, k, scratch.get(),
                                     picks2.get<int32_t>(), grid, nullptr),
              cudaSuccess)
        << what;
    EXPECT_EQ(Download<int32_t>(picks2, m), got) << what;
    const auto raw = Download<uint32_t>(y2, static_cast<size_t>(m) * n);
    EXPECT_EQ(std::count(raw.begin(), raw.end(), 0xffffffffu), static_cast<long>(raw.size()))
        << what << ": logits written with the flag at 0";
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
