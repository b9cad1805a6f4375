// The late-filling producer kernel of the fence tests (late_fill.h).
#include <algorithm>

#include "engine/backend/cuda/kernels/pdl.cuh"
#include "late_fill.h"

namespace agentkv::testing {
namespace {

using backend::cuda::kernels::PdlLaunchDependents;
using backend::cuda::kernels::PdlWait;

__global__ void LateFillKernel(float* x, int64_t n, float value, uint32_t delay_ns) {
  PdlLaunchDependents();
  PdlWait();
  // __nanosleep sleeps at most ~1 ms per call and may wake early: count
  // the clock instead.
  // (Two cycles a nanosecond: at least delay_ns at clocks up to 2 GHz.)
  const long long until = clock64() + static_cast<long long>(delay_ns) * 2;
  while (clock64() < until) __nanosleep(1000);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = value;
}

}  // namespace

cudaError_t LaunchLateFill(float* x, int64_t n, float value, uint32_t delay_ns,
                           backend::cuda::kernels::LaunchConfig launch) {
  if (n <= 0) return cudaSuccess;
  // Few blocks (a grid-stride loop): the dependent's blocks fit beside
  // them while they sleep.
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 64));
  return backend::cuda::kernels::LaunchPdl(LateFillKernel, dim3(blocks), dim3(256), 0, launch, x, n,
                                           value, delay_ns);
}

}  // namespace agentkv::testing
