// The two-pass argmax (argmax.cu): ties, NaN, -inf.
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
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

TEST(CudaKernels, ArgmaxTiesAndNaN) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int cols = 151936;
  std::vector<float> x = Random(4 * cols, rng);
  x[0 * cols + 777] = 50.f;
  x[0 * cols + 90000] = 50.f;  // tie: the lower id wins
  x[1 * cols + 5] = NAN;
  x[1 * cols + 100000] = 60.f;
  std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, -INFINITY);  // nothing beats -inf: 0
  auto d = Upload(x);
  auto out = Poisoned<int32_t>(4);
  cuda::DeviceBuffer scratch;
  ASSERT_TRUE(scratch.Allocate(ArgmaxScratchBytes(4)).ok());
  ASSERT_EQ(LaunchArgmax(d.get<float>(), 4, cols, out.get<int32_t>(), scratch.get(), nullptr),
            cudaSuccess);
  auto got = Download<int32_t>(out, 4);
  int32_t best3 = 0;
  for (int i = 1; i < cols; ++i)
    if (x[3 * cols + i] > x[3 * cols + best3]) best3 = i;
  EXPECT_EQ(got[0], 777);
  EXPECT_EQ(got[1], 100000);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(got[3], best3);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
