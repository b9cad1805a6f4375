// Element-wise kernels: softcap, bf16 conversions, fill (elementwise.h).
#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/elementwise.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;

__global__ void SoftcapKernel(float* x, int64_t n, float cap) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void F32ToBf16Kernel(const float* in, bf16_t* out, int64_t n) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = ToBf(in[i]);
}

__global__ void Bf16ToF32Kernel(const bf16_t* in, float* out, int64_t n) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = Bf(in[i]);
}

__global__ void FillKernel(float* x, int64_t n, float value) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = value;
}

int GridFor(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

cudaError_t LaunchSoftcap(float* x, int64_t n, float cap, LaunchConfig launch) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(SoftcapKernel, dim3(GridFor(n, 256)), dim3(256), 0, launch, x, n, cap);
}

cudaError_t LaunchF32ToBf16(const float* in, bf16_t* out, int64_t n, LaunchConfig launch) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(F32ToBf16Kernel, dim3(GridFor(n, 256)), dim3(256), 0, launch, in, out, n);
}

cudaError_t LaunchBf16ToF32(const bf16_t* in, float* out, int64_t n, LaunchConfig launch) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(Bf16ToF32Kernel, dim3(GridFor(n, 256)), dim3(256), 0, launch, in, out, n);
}

cudaError_t LaunchFill(float* x, int64_t n, float value, LaunchConfig launch) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(FillKernel, dim3(GridFor(n, 256)), dim3(256), 0, launch, x, n, value);
}

}  // namespace agentkv::backend::cuda::kernels
