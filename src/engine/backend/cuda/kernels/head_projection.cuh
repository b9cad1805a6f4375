// One head of the QKV projection (fp32, or bf16 as prefill steps' GEMM
// writes it) to bf16, by one warp: the bias, the
// per-head RMSNorm (Qwen3's q/k norms) and the rotary, in the one order of
// arithmetic that QkvPost and the fused decode attention both use, so their
// results agree bit for bit. Split into a load and a finish so that a warp
// can issue the loads of several heads before it waits on any of them.
// Device code only; D / 2 a multiple of 32.
#pragma once

#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/attention.h"

namespace agentkv::backend::cuda::kernels {

template <int D>
struct HeadRegs {
  static constexpr int kHalf = D / 2, kPer = kHalf / 32;
  static_assert(kHalf % 32 == 0, "head_dim / 2 must be a multiple of 32");
  float x0[kPer], x1[kPer];  // elements lane + 32 u and lane + 32 u + D / 2
};

// src + b (b may be null) into registers; with planes > 1 (at most
// kMaxQkvPlanes), src is the sum of that many planes `plane` floats apart,
// added in plane order (every plane's loads issued first).
template <int D>
__device__ __forceinline__ void LoadHead(const float* src, const float* b, HeadRegs<D>& r, int lane,
                                         int planes = 1, int64_t plane = 0) {
  constexpr int kHalf = HeadRegs<D>::kHalf;
#pragma unroll
  for (int u = 0; u < HeadRegs<D>::kPer; ++u) {
    const int i = lane + 32 * u;
    if (planes > 1) {
      float a[kMaxQkvPlanes], c[kMaxQkvPlanes];
#pragma unroll
      for (int q = 0; q < kMaxQkvPlanes; ++q)
        if (q < planes) {
          a[q] = src[q * plane + i];
          c[q] = src[q * plane + i + kHalf];
        }
      float x0 = a[0], x1 = c[0];
#pragma unroll
      for (int q = 1; q < kMaxQkvPlanes; ++q)
        if (q < planes) {
          x0 += a[q];
          x1 += c[q];
        }
      r.x0[u] = x0 + (b ? b[i] : 0.f);
      r.x1[u] = x1 + (b ? b[i + kHalf] : 0.f);
      continue;
    }
    r.x0[u] = src[i] + (b ? b[i] : 0.f);
    r.x1[u] = src[i + kHalf] + (b ? b[i + kHalf] : 0.f);
  }
}

// src in bf16 (a projection rounded to bf16 by its GEMM) + b.
template <int D>
__device__ __forceinline__ void LoadHead(const bf16_t* src, const float* b, HeadRegs<D>& r,
                                         int lane) {
  constexpr int kHalf = HeadRegs<D>::kHalf;
#pragma unroll
  for (int u = 0; u < HeadRegs<D>::kPer; ++u) {
    const int i = lane + 32 * u;
    r.x0[u] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16) + (b ? b[i] : 0.f);
    r.x1[u] =
        __uint_as_float(static_cast<uint32_t>(src[i + kHalf]) << 16) + (b ? b[i + kHalf] : 0.f);
  }
}

// The rotary's sines and cosines of this lane's elements at one position:
// the same for every head of a token, so a warp that finishes several
// heads of one token computes them once (an 8,192-row QkvPost: 68.0 ->
// 58.6 us, bench/RESULTS.md item 62).
template <int D>
struct RotaryRegs {
  float sn[HeadRegs<D>::kPer], cs[HeadRegs<D>::kPer];
};

// (factor: the rope's attention factor on both, RopeAttentionFactor; 1
// outside YaRN.)
template <int D>
__device__ __forceinline__ void RotaryAt(const float* inv_freq, float factor, float pos,
                                         RotaryRegs<D>& rot, int lane) {
#pragma unroll
  for (int u = 0; u < HeadRegs<D>::kPer; ++u) {
    sincosf(pos * inv_freq[lane + 32 * u], &rot.sn[u], &rot.cs[u]);
    rot.sn[u] *= factor;
    rot.cs[u] *= factor;
  }
}

// dst (and dst2 unless null) = rotary(norm(r)) in bf16; nw null: no norm;
// rotary false: r as it is.
// rot: the token's RotaryRegs where the caller has them (else computed
// here from inv_freq, the attention factor and pos).
template <int D>
__device__ __forceinline__ void FinishHead(HeadRegs<D>& r, const float* nw, float eps,
                                           bool plus_one, const float* inv_freq, float rope_factor,
                                           float pos, bool rotary, __nv_bfloat16* dst,
                                           __nv_bfloat16* dst2, int lane,
                                           const RotaryRegs<D>* rot = nullptr) {
  constexpr int kHalf = HeadRegs<D>::kHalf, kPer = HeadRegs<D>::kPer;
  if (!rotary) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const __nv_bfloat16 a = __float2bfloat16_rn(r.x0[u]), c = __float2bfloat16_rn(r.x1[u]);
      dst[lane + 32 * u] = a;
      dst[lane + 32 * u + kHalf] = c;
      if (dst2) {
        dst2[lane + 32 * u] = a;
        dst2[lane + 32 * u + kHalf] = c;
      }
    }
    return;
  }
  if (nw != nullptr) {
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < kPer; ++u) ss += r.x0[u] * r.x0[u];
#pragma unroll
    for (int u = 0; u < kPer; ++u) ss += r.x1[u] * r.x1[u];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / D + eps);
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int i = lane + 32 * u;
      r.x0[u] = r.x0[u] * inv * (plus_one ? 1.f + nw[i] : nw[i]);
      r.x1[u] = r.x1[u] * inv * (plus_one ? 1.f + nw[i + kHalf] : nw[i + kHalf]);
    }
  }
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int i = lane + 32 * u;
    float sn, cs;
    if (rot != nullptr) {
      sn = rot->sn[u];
      cs = rot->cs[u];
    } else {
      sincosf(pos * inv_freq[i], &sn, &cs);
      sn *= rope_factor;
      cs *= rope_factor;
    }
    const __nv_bfloat16 a = __float2bfloat16_rn(r.x0[u] * cs - r.x1[u] * sn);
    const __nv_bfloat16 c = __float2bfloat16_rn(r.x1[u] * cs + r.x0[u] * sn);
    dst[i] = a;
    dst[i + kHalf] = c;
    if (dst2) {
      dst2[i] = a;
      dst2[i + kHalf] = c;
    }
  }
}

}  // namespace agentkv::backend::cuda::kernels
