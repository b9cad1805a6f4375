// The persistent prompt GEMM's residual form (dev/cuda/prompt_gemm_add.cu)
// against the CPU Linear: y += x . w^T in fp32 (one add an element), rows
// past m left as they were, partial token tiles, feature tiles past one
// raster band, grids of a few blocks; two launches give the same bits.
#include "tests/engine/backend/cuda/test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "dev/cuda/prompt_gemm_add.h"
#include "tests/engine/backend/cuda/kernels/kernel_test_util.h"

namespace agentkv {
namespace {

using namespace agentkv::testing;

TEST(DevCuda, PromptGemmAddMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(21);
  // The residual form: y += x . w^T in fp32 (one add an element), rows
  // past m left as they were.
  for (auto [m, n, k, grid] : {std::array{300, 2560, 320, 7}, std::array{129, 512, 1024, sms},
                               std::array{1, 256, 64, 1}}) {
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                             " grid " + std::to_string(grid) + " add";
    const auto x = Rounded(Random(static_cast<size_t>(m) * k, rng));
    const auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    auto y0 = Random(static_cast<size_t>(m + 1) * n, rng);
    std::fill(y0.begin() + static_cast<size_t>(m) * n, y0.end(), 12345.f);
    std::vector<float> ref(static_cast<size_t>(m) * n);
    backend::cpu::kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
    std::vector<float> first;
    for (int rep = 0; rep < 2; ++rep) {
      auto dy = Upload(y0);
      ASSERT_EQ(backend::cuda::dev::LaunchPromptGemmAdd(dx.get<backend::cuda::kernels::bf16_t>(),
                                                        dw.get<backend::cuda::kernels::bf16_t>(),
                                                        dy.get<float>(), m, n, k, grid, nullptr),
                cudaSuccess)
          << what;
      auto got = Download<float>(dy, static_cast<size_t>(m + 1) * n);
      EXPECT_EQ(std::count(got.begin() + static_cast<size_t>(m) * n, got.end(), 12345.f), n)
          << what << ": wrote past row m";
      got.resize(static_cast<size_t>(m) * n);
      EXPECT_LT(RelErr(got, ref), 1e-5) << what;
      if (rep == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << what;
      }
    }
  }
  EXPECT_FALSE(
      backend::cuda::dev::PromptGemmAddSupported(128, 384, 2048));  // not whole 256-feature tiles
  EXPECT_EQ(backend::cuda::dev::LaunchPromptGemmAdd(nullptr, nullptr, nullptr, 128, 384, 2048, sms,
                                                    nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace agentkv

#else

TEST(DevCuda, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
