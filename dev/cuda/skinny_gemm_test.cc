// The skinny tensor-core GEMM (dev/cuda/skinny_gemm.cu) against the CPU
// Linear.
#include "tests/engine/backend/cuda/test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <random>
#include <string>
#include <utility>

#include "dev/cuda/skinny_gemm.h"
#include "tests/engine/backend/cuda/kernels/kernel_test_util.h"

namespace agentkv {
namespace {

using namespace agentkv::testing;

// The tensor-core skinny GEMM at 1 to 8 rows, with K whole in one block and split across the blocks
// of a cluster, N not a multiple of the 128-feature tile. Launched twice: the second result must be
// bit-identical (the partials of a split K are added in a fixed order).
TEST(DevCuda, SkinnyGemmMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(10);
  const int sms = 132;
  for (auto [n, k] : {std::pair{3072, 2048}, std::pair{2048, 8192}, std::pair{16384, 2048},
                      std::pair{200, 384}}) {
    for (int m : {1, 3, 7, 8}) {
      ASSERT_TRUE(backend::cuda::SkinnyGemmSupported(m, n, k));
      const bool f32 = m % 2 == 1;
      CheckGemmAgainstLinear(
          m, n, k, f32, rng,
          std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) + " splits " +
              std::to_string(backend::cuda::SkinnyGemmSplits(n, k, sms)),
          [&](const backend::cuda::kernels::bf16_t* x, const backend::cuda::kernels::bf16_t* w,
              void* y, float beta) {
            return backend::cuda::LaunchSkinnyGemm(x, w, y, f32, m, n, k, beta, sms, nullptr);
          });
    }
  }
  EXPECT_GT(backend::cuda::SkinnyGemmSplits(3072, 2048, sms), 1);
  EXPECT_EQ(backend::cuda::SkinnyGemmSplits(128256, 2048, sms), 1);
  EXPECT_FALSE(backend::cuda::SkinnyGemmSupported(backend::cuda::kMaxSkinnyRows + 1, 2048, 2048));
  EXPECT_FALSE(backend::cuda::SkinnyGemmSupported(8, 2048, 2112));
}

}  // namespace
}  // namespace agentkv

#else

TEST(DevCuda, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
