// Row bias (bias.h).
#include "engine/backend/cuda/kernels/bias.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

__global__ void AddRowBiasKernel(float* x, const float* bias, int64_t n, int cols) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += bias[i % cols];
}

}  // namespace

cudaError_t LaunchAddRowBias(float* x, const float* bias, int64_t rows, int cols,
                             LaunchConfig launch) {
  const int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  if (cols <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (n + 255) / 256;
  return LaunchPdl(AddRowBiasKernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                   dim3(256), 0, launch, x, bias, n, cols);
}

}  // namespace agentkv::backend::cuda::kernels
