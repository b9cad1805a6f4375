#include <cuda_bf16.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/dequant.h"
#include "engine/backend/cuda/kernels/moe_quant.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

// Eight floats as bf16 (round to nearest even), 16 bytes.
__device__ __forceinline__ uint4 PackBf16x8(const float* f) {
  uint32_t p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b2 = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    p[i] = *reinterpret_cast<const uint32_t*>(&b2);
  }
  return make_uint4(p[0], p[1], p[2], p[3]);
}

// A thread per 16 values of a row: one 16-byte load of codes,
// one scale, two 16-byte stores. Memory-bound: 3 bytes moved per value.
__global__ void DequantFp8Kernel(const uint8_t* __restrict__ codes,
                                 const float* __restrict__ scales, int64_t vecs, int k_vecs,
                                 int nkb, int block_vecs, bf16_t* __restrict__ out) {
  // The scratch written here may still be read by the kernel before this
  // one (the previous projection's GEMM).
  PdlWait();
  PdlLaunchDependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < vecs) {
    const int64_t r = i / k_vecs;
    const int c = static_cast<int>(i - r * k_vecs);
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(codes) + i);
    const float s = __ldg(scales + r * nkb + c / block_vecs);
    float f[16];
    moeq::E4m3x4(raw.x, f);
    moeq::E4m3x4(raw.y, f + 4);
    moeq::E4m3x4(raw.z, f + 8);
    moeq::E4m3x4(raw.w, f + 12);
#pragma unroll
    for (int j = 0; j < 16; ++j) f[j] *= s;
    uint4* dst = reinterpret_cast<uint4*>(out) + 2 * i;
    dst[0] = PackBf16x8(f);
    dst[1] = PackBf16x8(f + 8);
  }
}

// A thread per 32-value block: 16 bytes of nibbles, one exponent, four
// 16-byte stores.
__global__ void DequantMxfp4Kernel(const uint8_t* __restrict__ blocks,
                                   const uint8_t* __restrict__ exps, int64_t nblocks,
                                   bf16_t* __restrict__ out) {
  PdlWait();
  PdlLaunchDependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < nblocks) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(blocks) + i);
    // (Fp4x8 gives the values times 2^-14.)
    const float s = moeq::E8m0(__ldg(exps + i)) * 16384.f;
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint4* dst = reinterpret_cast<uint4*>(out) + 4 * i;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float f[8];
      moeq::Fp4x8(w[q], f);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] *= s;
      dst[q] = PackBf16x8(f);
    }
  }
}

// A thread per item, blocks of 256 (n * k / 16 items: millions for a
// projection, so every SM is busy).
dim3 DequantGrid(int64_t items) { return dim3(static_cast<unsigned>((items + 255) / 256)); }

}  // namespace

cudaError_t LaunchDequantFp8(const uint8_t* codes, const float* scales, int n, int k,
                             int block_cols, bf16_t* out, LaunchConfig launch) {
  if (!DequantFp8Supported(n, k, block_cols)) return cudaErrorInvalidValue;
  const int k_vecs = k / kDequantFp8Vec;
  const int64_t vecs = static_cast<int64_t>(n) * k_vecs;
  const int nkb = (k + block_cols - 1) / block_cols;
  return LaunchPdl(DequantFp8Kernel, DequantGrid(vecs), dim3(256), 0, launch, codes, scales, vecs,
                   k_vecs, nkb, block_cols / kDequantFp8Vec, out);
}

cudaError_t LaunchDequantMxfp4(const uint8_t* blocks, const uint8_t* exps, int n, int k,
                               bf16_t* out, LaunchConfig launch) {
  if (n <= 0 || k <= 0 || k % kDequantMxfp4Block != 0) return cudaErrorInvalidValue;
  const int64_t nblocks = static_cast<int64_t>(n) * (k / kDequantMxfp4Block);
  return LaunchPdl(DequantMxfp4Kernel, DequantGrid(nblocks), dim3(256), 0, launch, blocks, exps,
                   nblocks, out);
}

}  // namespace agentkv::backend::cuda::kernels
