// Helpers of the tests that run collectives over several GPUs
// (nccl_comms_test.cc, nccl_windows_test.cc, tp_backend_test.cc): skip
// below n GPUs, communicators over every visible GPU with NVLink multicast
// off, one thread and stream per rank, and a captured graph launched a few
// times (decode steps hold their collectives in graphs). Only for builds
// with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/status.h"
#include "test_util.h"

// Skips the test unless n GPUs are visible (and a GPU at all).
#define AGENTKV_REQUIRE_GPUS(n)                                                               \
  do {                                                                                        \
    AGENTKV_REQUIRE_GPU();                                                                    \
    if (::agentkv::backend::cuda::VisibleGpus() < (n))                                        \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << ::agentkv::backend::cuda::VisibleGpus() \
                   << " visible";                                                             \
  } while (0)

namespace agentkv::testing {

// Communicators over every visible GPU (rank i on GPU i), NVLink multicast
// off: NCCL_NVLS_ENABLE=0 (unless the environment sets it) before the
// first communicator, as main() does.
inline Result<std::unique_ptr<backend::cuda::NcclComms>> CommsOnEveryGpu() {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::vector<int> devices(backend::cuda::VisibleGpus());
  std::iota(devices.begin(), devices.end(), 0);
  return backend::cuda::NcclComms::Create(devices, backend::cuda::NcclOptions{"0"});
}

// Runs fn(rank, stream) for ranks 0 .. n - 1 at once, each on a thread of
// its own with GPU `rank` current and a new stream of it (waited for and
// destroyed after fn returns); the first failure.
template <typename Fn>
Status OnEveryRank(int n, Fn fn) {
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      st[r] = [&]() -> Status {
        CUDA_RETURN_IF_ERROR(cudaSetDevice(r));
        cudaStream_t s = nullptr;
        CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        const Status done = fn(r, s);
        const cudaError_t sync = cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
        RETURN_IF_ERROR(done);
        CUDA_RETURN_IF_ERROR(sync);
        return Status::Ok();
      }();
    });
  for (std::thread& t : threads) t.join();
  for (const Status& s : st)
    if (!s.ok()) return s;
  return Status::Ok();
}

// What enqueue() queues on `s`, captured into a CUDA graph, launched
// `launches` times on `s` and waited for.
template <typename Fn>
Status RunCaptured(cudaStream_t s, int launches, Fn enqueue) {
  cudaGraph_t g = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status queued = enqueue();
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  if (!queued.ok() || end != cudaSuccess) {
    if (g != nullptr) cudaGraphDestroy(g);
    RETURN_IF_ERROR(queued);
    CUDA_RETURN_IF_ERROR(end);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  CUDA_RETURN_IF_ERROR(made);
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < launches && e == cudaSuccess; ++i) e = cudaGraphLaunch(exec, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaGraphExecDestroy(exec);
  CUDA_RETURN_IF_ERROR(e);
  return Status::Ok();
}

}  // namespace agentkv::testing
