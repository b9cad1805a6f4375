// The two-pass argmax kernels (argmax.h).
#include <cfloat>
#include <climits>

#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

// The best (value, index) of a block's threads, in lane 0 of warp 0.
__device__ void BlockBest(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      Better(bv, bi, ov, oi);
    }
  }
}

// Stage 1: block (c, r) finds the best of chunk c of row r.
__global__ void ArgmaxPartKernel(const float* x, int cols, float2* part) {
  PdlLaunchDependents();
  PdlWait();
  const int per = (cols + kArgmaxChunks - 1) / kArgmaxChunks;
  const int begin = blockIdx.x * per, end = min(cols, begin + per);
  const float* r = x + static_cast<int64_t>(blockIdx.y) * cols;
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) Better(bv, bi, r[i], i);
  BlockBest(bv, bi);
  if (threadIdx.x == 0)
    part[blockIdx.y * kArgmaxChunks + blockIdx.x] = make_float2(bv, __int_as_float(bi));
}

// Stage 2: one block per row over its chunks' bests.
__global__ void ArgmaxKernel(const float2* part, int chunks, int32_t* out) {
  PdlLaunchDependents();
  PdlWait();
  float bv = -INFINITY;
  int bi = INT_MAX;
  // Eight parts a thread requested at once (the LM head's 2,004 at 256
  // threads; one at a time, their round trips added up to ~5 us a step).
  constexpr int kBatch = 8;
  const float2* row = part + static_cast<int64_t>(blockIdx.x) * chunks;
  for (int c0 = threadIdx.x; c0 < chunks; c0 += kBatch * blockDim.x) {
    float2 p[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = c0 + u * blockDim.x;
      p[u] = c < chunks ? row[c] : make_float2(-INFINITY, __int_as_float(INT_MAX));
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) Better(bv, bi, p[u].x, __float_as_int(p[u].y));
  }
  BlockBest(bv, bi);
  // Only -inf (or NaN) values: the host sampler answers 0 then; among -inf
  // values it would also keep 0, which is the lowest index.
  if (threadIdx.x == 0) out[blockIdx.x] = (bi == INT_MAX || bv == -INFINITY) ? 0 : bi;
}

}  // namespace

cudaError_t LaunchArgmax(const float* x, int rows, int cols, int32_t* out, void* scratch,
                         LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  float2* part = static_cast<float2*>(scratch);
  cudaError_t e =
      LaunchPdl(ArgmaxPartKernel, dim3(kArgmaxChunks, rows), dim3(256), 0, launch, x, cols, part);
  if (e != cudaSuccess) return e;
  return LaunchPdl(ArgmaxKernel, dim3(rows), dim3(64), 0, launch, part, kArgmaxChunks, out);
}

cudaError_t LaunchArgmaxOfParts(const void* parts, int rows, int chunks, int32_t* out,
                                LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  if (chunks <= 0) return cudaErrorInvalidValue;
  return LaunchPdl(ArgmaxKernel, dim3(rows), dim3(chunks > 64 ? 256 : 64), 0, launch,
                   static_cast<const float2*>(parts), chunks, out);
}

}  // namespace agentkv::backend::cuda::kernels
