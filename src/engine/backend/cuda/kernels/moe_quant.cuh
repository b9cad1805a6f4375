// Device helpers the MoE kernels share to read quantized expert weights
// (moe.h's MoeWeightFormat): fp8 e4m3 and e2m1 (mxfp4) values to floats,
// E8M0 exponents, and where an fp8 weight's block scale lives. The CPU
// decoders they agree with are engine/model/quant_format.h's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/moe.h"

namespace agentkv::backend::cuda::kernels::moeq {

// Eight bf16 values (a 16-byte load) as floats.
__device__ __forceinline__ void Bf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Four e4m3 codes (the low byte first) as floats: the hardware's
// e4m3x2 -> f16x2 conversion (exact: every e4m3 value is an f16), NaN codes
// to NaN.
__device__ __forceinline__ void E4m3x4(uint32_t u, float* f) {
  const __half2_raw lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xffffu), __NV_E4M3);
  const __half2_raw hi =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// Eight e2m1 values (four bytes, the low nibble of each first) as floats
// times 2^-14: each nibble's sign goes to an f16's bit 15 and its exponent
// and mantissa to bits 11..9, which makes the f16 the e2m1 value times
// 2^-14 exactly, normal or not.
__device__ __forceinline__ void Fp4x8(uint32_t u, float (&f)[8]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t v = (u >> (8 * b)) & 0xffu;
    const uint32_t h =
        ((v & 0x7u) << 9) | ((v & 0x8u) << 12) | ((v & 0x70u) << 21) | ((v & 0x80u) << 24);
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&h));
    f[2 * b] = p.x;
    f[2 * b + 1] = p.y;
  }
}

// 2^(e - 127) (E8M0; 255 is NaN), as the CPU's E8m0ToF32.
__device__ __forceinline__ float E8m0(uint32_t e) {
  return e == 255u ? __uint_as_float(0x7fc00000u)
         : e == 0u ? __uint_as_float(0x00400000u)
                   : __uint_as_float(e << 23);
}

// The block scale of fp8 weight (n, k) of expert e (MoeGemmParams' layout,
// scale_pairs included).
__device__ __forceinline__ float Fp8Scale(const MoeGemmParams& p, int e, int n, int k) {
  const int kb = k / p.block_cols, nkb = (p.K + p.block_cols - 1) / p.block_cols;
  int64_t rb;
  if (p.scale_pairs) {
    const int half_blocks = (p.N / 2 + p.block_rows - 1) / p.block_rows;
    rb =
        static_cast<int64_t>(e) * 2 * half_blocks + (n & 1) * half_blocks + (n >> 1) / p.block_rows;
  } else {
    rb = static_cast<int64_t>(e) * ((p.N + p.block_rows - 1) / p.block_rows) + n / p.block_rows;
  }
  return __ldg(p.scales + rb * nkb + kb);
}

}  // namespace agentkv::backend::cuda::kernels::moeq
