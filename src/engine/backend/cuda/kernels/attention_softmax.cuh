// The online softmax of the flash attention kernels and what surrounds it
// (device code only), shared by the mma.sync kernel (flash_attention.cu)
// and the warpgroup prefill kernel (wgmma_attention.cu): both hold a
// warp's 16 query rows as two rows per thread (g and g + 8, lane = 4 g +
// q4), scores and outputs in fragments of 8 columns (the m16n8 / m64nN
// accumulator layout: [j][e] is row g + 8 (e >> 1), column 8 j + 2 q4 +
// (e & 1)).
#pragma once

#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/attention_common.cuh"

namespace agentkv::backend::cuda::kernels {

constexpr float kLog2e = 1.4426950408889634f;

// 2^x with subnormal inputs and results flushed to zero: one MUFU.EX2.
// exp2f's ex2.approx.f32 scales subnormals around it, three more
// instructions a score in the tiles that the ALU bounds. (Flushed are
// weights below 2^-126 of a row's largest, invisible in the bf16 P and
// its fp32 sum; inputs of |x| < 2^-126 give 1 either way.)
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A tile's sequence and the keys [kb, ke) its split walks: from the window's
// start (or 0) to its last token's position, split in runs of a multiple
// of 16 keys.
struct TileSpan {
  int s, t0, start, first, p0, kb, ke;
};
__device__ __forceinline__ TileSpan SpanOf(const AttentionParams& p, int tile, int n, int split) {
  TileSpan t;
  t.s = p.tile_seq[tile];
  t.t0 = p.tile_t0[tile];
  t.start = p.seq_start[t.s];
  t.first = p.seq_first[t.s];
  t.p0 = p.pos[t.t0];
  const int hi = p.pos[t.t0 + n - 1] + 1;
  const int lo = p.window > 0 ? max(0, t.p0 - p.window + 1) : 0;
  // (One split, as every prompt step has: no integer division.)
  const int span = p.splits == 1 ? hi - lo : (hi - lo + p.splits - 1) / p.splits;
  const int chunk = (span + 15) / 16 * 16;
  t.kb = lo + split * chunk;
  t.ke = min(hi, t.kb + chunk);
  return t;
}

// A thread's two query rows: whether each is a real row of the tile, its
// position and its output row (token * nh + head).
struct QueryRows {
  int pos[2];
  bool valid[2];
  int64_t out_row[2];
};

// Rows rg * 16 + g (+ 8) of a tile whose row r is head kvh * G + r % G of
// token t0 + r / G (tpt tokens a tile at most, n in this one).
__device__ __forceinline__ QueryRows TileRows(const AttentionParams& p, int rg, int g, int t0,
                                              int n, int tpt, int kvh, int G) {
  QueryRows q;
  for (int i = 0; i < 2; ++i) {
    const int r = rg * 16 + g + 8 * i, tok = DivG(r, G);
    q.valid[i] = tok < tpt && tok < n;
    q.pos[i] = q.valid[i] ? p.pos[t0 + tok] : -1;
    q.out_row[i] = q.valid[i] ? static_cast<int64_t>(t0 + tok) * p.nh + kvh * G + (r - tok * G) : 0;
  }
  return q;
}

// One stage of keys from k0 (NS fragments of 8) for a warp's rows: sc holds
// the raw scores Q K^T on entry and P (unnormalised, as floats) on return;
// the running max m (log2 units), sum l and output o are updated. `fast`:
// every key of the stage is visible to every row (no mask, window or
// softcap), so the scale goes into the exponent's FMA and no -inf test is
// needed, ~3 of the ~7 instructions per score that bound the prefill tiles.
// Stages with a mask but no softcap (the diagonal stage of every prompt
// tile) take the same exponent form, the mask as one select per score
// against each row's visible key range: the general path below spent ~16
// instructions a score, and a prompt tile's one masked stage was 15% of
// the warpgroup kernel's instructions.
template <int NS, int NO>
__device__ __forceinline__ void SoftmaxStage(float (&sc)[NS][4], float (&o)[NO][4], float (&m)[2],
                                             float (&l)[2], bool fast, const AttentionParams& p,
                                             const QueryRows& q, int k0, int ke, int q4) {
  const float scale2 = p.scale * kLog2e;
  float mx[2] = {-INFINITY, -INFINITY};
  const bool lean = !fast && !(p.softcap > 0.f);
  if (lean) {
    // Row i sees keys [lo, hi]: up to its position (and ke), from its
    // window's start; none for a row past the tile's tokens.
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      hi[i] = q.valid[i] ? min(q.pos[i], ke - 1) : -1;
      lo[i] = p.window > 0 ? q.pos[i] - p.window + 1 : 0;
    }
    const int kq = k0 + 2 * q4;
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, kp = kq + j * 8 + (e & 1);
        sc[j][e] = kp <= hi[i] && kp >= lo[i] ? sc[j][e] : -INFINITY;
        mx[i] = fmaxf(mx[i], sc[j][e]);
      }
    fast = true;  // from here on as the unmasked form; -inf scores give 0
  } else if (fast) {
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
  } else {
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, kp = k0 + j * 8 + 2 * q4 + (e & 1);
        float x = sc[j][e] * p.scale;
        if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
        x *= kLog2e;
        const bool ok =
            q.valid[i] && kp < ke && kp <= q.pos[i] && (p.window == 0 || kp > q.pos[i] - p.window);
        sc[j][e] = ok ? x : -INFINITY;
        mx[i] = fmaxf(mx[i], sc[j][e]);
      }
  }
  float alpha[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    if (fast) mx[i] *= scale2;  // (scale2 > 0: the max commutes with it)
    const float mn = fmaxf(m[i], mx[i]);
    alpha[i] = mn == -INFINITY ? 1.f : Exp2(m[i] - mn);
    m[i] = mn;
  }
  float ps[2] = {0.f, 0.f};
  if (fast) {
    // A row with no visible key yet (lean stages only) keeps m = -inf;
    // its scores are all -inf and give 0 against any finite offset.
    const float mo[2] = {m[0] == -INFINITY ? 0.f : m[0], m[1] == -INFINITY ? 0.f : m[1]};
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const float pj = Exp2(fmaf(sc[j][e], scale2, -mo[i]));
        sc[j][e] = pj;
        ps[i] += pj;
      }
  } else {
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const float pj = sc[j][e] == -INFINITY ? 0.f : Exp2(sc[j][e] - m[i]);
        sc[j][e] = pj;
        ps[i] += pj;
      }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    ps[i] += __shfl_xor_sync(0xffffffffu, ps[i], 1);
    ps[i] += __shfl_xor_sync(0xffffffffu, ps[i], 2);
    l[i] = l[i] * alpha[i] + ps[i];
  }
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }
}

// A split with no keys: zero parts (m = -inf), so the merge skips it.
template <int D>
__device__ __forceinline__ void StoreEmptySplit(const AttentionParams& p, const QueryRows& q,
                                                int split, int q4) {
  for (int i = 0; i < 2; ++i) {
    if (!q.valid[i]) continue;
    const int64_t b = q.out_row[i] * p.splits + split;
    for (int d = q4; d < D; d += 4) p.part_o[b * D + d] = 0.f;
    if (q4 == 0) {
      p.part_ml[b * 2] = -INFINITY;
      p.part_ml[b * 2 + 1] = 0.f;
    }
  }
}

// A warp's rows at the end of its keys: normalised into out (one split, the
// sink joining the denominator), or the unnormalised output and (m, l) into
// the split's parts (the merge adds the sink).
template <int D, int NO>
__device__ __forceinline__ void StoreRows(const AttentionParams& p, const QueryRows& q,
                                          const float (&o)[NO][4], const float (&m)[2],
                                          const float (&l)[2], int split, int q4) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!q.valid[i]) continue;
    if (p.splits == 1) {
      // (m is in log2 units here; the sink's head is the row's mod nh.)
      const float inv = p.sinks == nullptr
                            ? (l[i] > 0.f ? 1.f / l[i] : 0.f)
                            : SoftmaxNormaliser(m[i] == -INFINITY ? -INFINITY : m[i] / kLog2e, l[i],
                                                p.sinks, static_cast<int>(q.out_row[i] % p.nh));
      __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out) + q.out_row[i] * D;
#pragma unroll
      for (int j = 0; j < NO; ++j)
        *reinterpret_cast<__nv_bfloat162*>(out + j * 8 + 2 * q4) =
            __floats2bfloat162_rn(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
    } else {
      const int64_t b = q.out_row[i] * p.splits + split;
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        p.part_o[b * D + j * 8 + 2 * q4] = o[j][2 * i];
        p.part_o[b * D + j * 8 + 2 * q4 + 1] = o[j][2 * i + 1];
      }
      if (q4 == 0) {
        p.part_ml[b * 2] = m[i] == -INFINITY ? -INFINITY : m[i] / kLog2e;
        p.part_ml[b * 2 + 1] = l[i];
      }
    }
  }
}

}  // namespace agentkv::backend::cuda::kernels
