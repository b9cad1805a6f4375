// Device helpers the element-wise, norm and rotary kernels share: bf16
// bits to and from float, and sums over a warp or a block.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels::reduce {

__device__ __forceinline__ float Bf(bf16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}
__device__ __forceinline__ bf16_t ToBf(float f) {
  __nv_bfloat16 b = __float2bfloat16_rn(f);
  return *reinterpret_cast<bf16_t*>(&b);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
// gets the result. `red` holds 32 floats.
__device__ inline float BlockSum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float s = lane < nw ? red[lane] : 0.f;
  return WarpSum(s);
}

// Row counts from which the norm and activation kernels give each thread
// several vectors (prefill steps); decode-sized steps keep more blocks.
constexpr int kManyRows = 256;

}  // namespace agentkv::backend::cuda::kernels::reduce
