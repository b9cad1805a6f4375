// Whether launches carry programmatic dependent launch (pdl.cuh).
#include "engine/backend/cuda/kernels/pdl.cuh"

#include <atomic>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::cuda {
namespace {

// SetPdlLaunches's setting.
std::atomic<bool> pdl_launches{true};

}  // namespace

void SetPdlLaunches(bool on) { pdl_launches.store(on, std::memory_order_relaxed); }

bool PdlEnabled() {
  // The device's compute capability, asked once.
  static const bool supported = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return supported && pdl_launches.load(std::memory_order_relaxed);
}

}  // namespace agentkv::cuda
