// Whether the device has programmatic dependent launch (pdl.cuh).
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {

bool PdlSupported() {
  // The device's compute capability, asked once.
  static const bool supported = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return supported;
}

}  // namespace agentkv::backend::cuda::kernels
