// NcclWindows: where this build and the loaded NCCL have symmetric windows
// and 2 or more GPUs are visible, a window on every rank whose fp32 sums
// (plain and from a captured graph, at offsets alike on every rank, the
// sizes of decode steps' residuals) equal the plain buffers', also right
// after a kernel that lets its dependents launch early (behind the fence);
// otherwise the reason is given and Create refuses with it.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <cstdio>
#include <string>
#include <vector>

#include "engine/backend/cuda/kernels/tp.h"
#include "engine/backend/cuda/nccl_windows.h"
#include "engine/backend/tp_reduce_plan.h"
#include "late_fill.h"
#include "nccl_test_util.h"

namespace agentkv::backend::cuda {
namespace {

using cuda::NcclWindows;

TEST(NcclWindows, SupportedOrSaysWhy) {
  std::string why;
  if (NcclWindows::Supported(&why)) {
    EXPECT_TRUE(why.empty());
  } else {
    EXPECT_FALSE(why.empty());
  }
}

TEST(NcclWindows, SumsInTheWindowAsInPlainBuffers) {
  AGENTKV_REQUIRE_GPUS(2);
  const int n = cuda::VisibleGpus();
  auto comms = testing::CommsOnEveryGpu();
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  std::string why;
  if (!NcclWindows::Supported(&why)) {
    auto w = NcclWindows::Create(**comms, 4096);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kUnimplemented);
    GTEST_SKIP() << why;
  }
  EXPECT_FALSE(NcclWindows::Create(**comms, 0).ok());
  const size_t kBytes = 3 << 20;
  auto made = NcclWindows::Create(**comms, kBytes - 100);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const NcclWindows& w = **made;
  EXPECT_EQ(w.bytes(), kBytes);  // rounded up to the window alignment
  // One token at hidden 2,048 (8 KB), 64 at 4,096 (1 MB), an odd count at
  // an offset past the first buffer.
  struct Case {
    size_t count, offset;
  };
  for (const Case& k : {Case{2048, 0}, Case{64 * 4096, 0}, Case{100003, size_t{1} << 20}}) {
    std::vector<std::vector<float>> got(n);
    const Status st = testing::OnEveryRank(n, [&](int r, cudaStream_t s) -> Status {
      std::vector<float> x(k.count);
      for (size_t i = 0; i < k.count; ++i) x[i] = static_cast<float>((i % 31) * (r + 1));
      float* buf = reinterpret_cast<float*>(static_cast<char*>(w.ptr(r)) + k.offset);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(buf, x.data(), k.count * 4, cudaMemcpyHostToDevice));
      const cuda::NcclRank rank = (*comms)->rank(r);
      RETURN_IF_ERROR(rank.SumF32(buf, k.count, s));
      // Then twice more from a captured graph: x (n (n + 1) / 2)^3.
      RETURN_IF_ERROR(testing::RunCaptured(s, 2, [&] { return rank.SumF32(buf, k.count, s); }));
      got[r].resize(k.count);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(got[r].data(), buf, k.count * 4, cudaMemcpyDeviceToHost));
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    // Small integers: exact in fp32 whatever the order of the sums.
    const double f = n * (n + 1) / 2.0;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < k.count; i += 7)
        ASSERT_EQ(got[r][i], static_cast<float>((i % 31) * f * n * n))
            << "rank " << r << " element " << i << " count " << k.count;
  }
}

// The producer an all-reduce from a window can meet: a kernel that lets its
// dependents launch at its start (as every backend kernel does) and writes
// its rows ~200 us later. Behind the fence (kernels::LaunchStreamFence, as
// CudaBackend::TpReduce puts it where TpWindowReduceNeedsFence says) the
// sum is of the written rows. Without it, where the NCCL loaded needs the
// fence, its symmetric kernel may read the rows before they are written:
// printed (how many elements came out stale), not asserted (a race);
// where it does not, the unfenced sum must be exact too.
TEST(NcclWindows, SumsWhatAnEarlyLaunchingKernelWroteBehindTheFence) {
  AGENTKV_REQUIRE_GPUS(2);
  const int n = cuda::VisibleGpus();
  std::string why;
  if (!NcclWindows::Supported(&why)) GTEST_SKIP() << why;
  auto comms = testing::CommsOnEveryGpu();
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  auto made = NcclWindows::Create(**comms, size_t{1} << 20);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const int version = cuda::NcclLoadedVersion();
  const bool needs = TpWindowReduceNeedsFence(version, major);
  // One row at hidden 2,048 (NCCL's LL symmetric kernel) and 64 rows at
  // 4,096 (the load/store one).
  for (size_t count : {size_t{2048}, size_t{64} * 4096}) {
    for (bool fence : {true, false}) {
      std::vector<std::vector<float>> got(n);
      const Status st = testing::OnEveryRank(n, [&](int r, cudaStream_t s) -> Status {
        float* buf = static_cast<float*>((*made)->ptr(r));
        CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buf, 0, count * 4, s));
        // (A first sum outside the timing, so NCCL has connected.)
        RETURN_IF_ERROR((*comms)->rank(r).SumF32(buf, count, s));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
        CUDA_RETURN_IF_ERROR(testing::LaunchLateFill(buf, static_cast<int64_t>(count),
                                                     static_cast<float>(r + 1), 200'000,
                                                     kernels::LaunchConfig(s, true)));
        if (fence) CUDA_RETURN_IF_ERROR(kernels::LaunchStreamFence(s));
        RETURN_IF_ERROR((*comms)->rank(r).SumF32(buf, count, s));
        got[r].resize(count);
        CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(got[r].data(), buf, count * 4, cudaMemcpyDeviceToHost, s));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
        return Status::Ok();
      });
      ASSERT_TRUE(st.ok()) << st.ToString();
      const float want = n * (n + 1) / 2.0f;  // exact in fp32
      size_t stale = 0;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) stale += got[r][i] != want;
      std::printf("NCCL %d, compute capability %d, %zu floats, %s: %zu of %zu elements stale%s\n",
                  version, major, count, fence ? "fenced" : "unfenced", stale, count * n,
                  fence ? "" : (needs ? " (this NCCL needs the fence)" : ""));
      if (fence || !needs) {
        EXPECT_EQ(stale, 0u) << count << " floats, fence " << fence;
      }
    }
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else
TEST(NcclWindows, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }
#endif
