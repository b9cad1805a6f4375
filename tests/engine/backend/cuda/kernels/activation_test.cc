// The gated activation kernel (activation.cu) against the CPU reference.
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
#include "engine/backend/cuda/kernels/activation.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

TEST(CudaKernels, GatedActivation) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(4);
  // Multiples of 4 take the vectorised kernel; 260 rows its layout for many
  // rows (prefill).
  for (int rows : {3, 260})
    for (int n : {1000, 1001, 8192})
      for (model::Activation a : {model::Activation::kSilu, model::Activation::kGeluTanh}) {
        auto gu = Rounded(Random(rows * 2 * n, rng, 2.f));
        auto d = Upload(Bf16Of(Interleaved(gu, rows, n)));
        auto out = Poisoned<uint16_t>(rows * n);
        ASSERT_EQ(LaunchGatedAct(d.get<bf16_t>(), out.get<bf16_t>(), rows, n,
                                 a == model::Activation::kSilu ? 0 : 1, nullptr),
                  cudaSuccess);
        std::vector<float> ref(rows * n);
        cpu::kernels::GatedActivation(gu.data(), ref.data(), rows, n, a);
        EXPECT_LT(RelErr(DownloadBf16(out, rows * n), ref), 1e-2) << n << " " << rows;
      }
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
