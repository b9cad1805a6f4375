// PerDeviceOnce: a setting made once per device, such as a kernel's
// function attributes (cudaFuncSetAttribute's shared memory limit), which
// belong to the device's context: a process driving several GPUs (tensor
// parallelism, one thread per GPU) makes them on each. Host code.
//
// Thread-safety: Run may be called from any thread; two threads on one
// device may both run `set` (it must be idempotent, as attribute settings
// are).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace agentkv::backend::cuda::kernels {

class PerDeviceOnce {
 public:
  // Runs set() (returning cudaError_t) unless it succeeded before on the
  // current device; its error, else cudaSuccess.
  template <typename Set>
  cudaError_t Run(Set&& set) {
    int dev = 0;
    if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    const uint64_t bit = uint64_t{1} << (dev & 63);
    if (done_.load(std::memory_order_acquire) & bit) return cudaSuccess;
    const cudaError_t e = set();
    if (e == cudaSuccess) done_.fetch_or(bit, std::memory_order_acq_rel);
    return e;
  }

 private:
  std::atomic<uint64_t> done_{0};
};

}  // namespace agentkv::backend::cuda::kernels
