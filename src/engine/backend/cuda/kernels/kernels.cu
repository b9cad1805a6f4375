// Element-wise, normalisation, rotary, KV store and sampling kernels
// (attention is in attention.cu). See kernels.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/head_projection.cuh"
#include "engine/backend/cuda/kernels/head_route.h"
#include "engine/backend/cuda/kernels/kernels.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::cuda {
namespace {

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
__device__ float BlockSum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float s = lane < nw ? red[lane] : 0.f;
  return WarpSum(s);
}

__global__ void EmbedKernel(const bf16_t* embed, const int32_t* tokens, const int32_t* picks,
                            int dim, float scale, float* x, bool vec) {
  PdlLaunchDependents();
  PdlWait();
  int32_t tok = tokens[blockIdx.x];
  if (tok < 0) tok = picks[-1 - tok];
  const int64_t row = static_cast<int64_t>(tok) * dim;
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  if (vec) {
    // 8 elements a thread: a row of 2,048 in one load each (the 2-byte
    // loads of the loop below went out one after another: ~5 us, the decode
    // step's first kernel).
    const uint4* er = reinterpret_cast<const uint4*>(embed + row);
    float4* xv = reinterpret_cast<float4*>(xr);
    for (int i = threadIdx.x; i < dim / 8; i += blockDim.x) {
      const uint4 v = er[i];
      const bf16_t* e = reinterpret_cast<const bf16_t*>(&v);
      float f[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = Bf(e[j]) * scale;
      xv[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
      xv[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    return;
  }
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = Bf(embed[row + i]) * scale;
}

__global__ void RmsNormKernel(const float* x, const int32_t* rows_idx, const float* w, bf16_t* out,
                              int dim, float eps, bool plus_one) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ float red[32];
  const int64_t src = rows_idx ? rows_idx[blockIdx.x] : blockIdx.x;
  const float* xr = x + src * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  bf16_t* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = plus_one ? 1.0f + w[i] : w[i];
    o[i] = ToBf(xr[i] * inv * g);
  }
}

// RmsNormKernel for dim a multiple of 4 and at most kNormVec * 4 per
// thread: float4 loads, the row kept in registers between the sum and the
// scaling (one read of x instead of two), 8-byte bf16 stores.
constexpr int kNormVec = 4;
__global__ void RmsNormVecKernel(const float* x, const int32_t* rows_idx, const float* w,
                                 bf16_t* out, int dim, float eps, bool plus_one) {
  // Norm weights before the wait (no kernel writes them): one round trip
  // less after it.
  const int nv = dim / 4;
  const float4* wv = reinterpret_cast<const float4*>(w);
  float4 g[kNormVec];
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    g[j] = i < nv ? __ldg(wv + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (plus_one) g[j] = make_float4(1.f + g[j].x, 1.f + g[j].y, 1.f + g[j].z, 1.f + g[j].w);
  }
  PdlLaunchDependents();
  PdlWait();
  __shared__ float red[32];
  const int64_t src = rows_idx ? rows_idx[blockIdx.x] : blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + src * dim);
  float4 v[kNormVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    v[j] = i < nv ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  uint2* o = reinterpret_cast<uint2*>(out + static_cast<int64_t>(blockIdx.x) * dim);
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= nv) break;
    const uint32_t lo = static_cast<uint32_t>(ToBf(v[j].x * inv * g[j].x)) |
                        static_cast<uint32_t>(ToBf(v[j].y * inv * g[j].y)) << 16;
    const uint32_t hi = static_cast<uint32_t>(ToBf(v[j].z * inv * g[j].z)) |
                        static_cast<uint32_t>(ToBf(v[j].w * inv * g[j].w)) << 16;
    o[i] = make_uint2(lo, hi);
  }
}

__global__ void AddNormedKernel(const float* o, const float* w_post, float* x, const float* w_pre,
                                bf16_t* h, int dim, float eps, bool plus_one) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ float red[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += o[base + i] * o[base + i];
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  float ss2 = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = plus_one ? 1.0f + w_post[i] : w_post[i];
    const float v = x[base + i] + o[base + i] * inv * g;
    x[base + i] = v;
    ss2 += v * v;
  }
  if (w_pre == nullptr) return;
  ss2 = BlockSum(ss2, red);
  const float inv2 = 1.0f / sqrtf(ss2 / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = plus_one ? 1.0f + w_pre[i] : w_pre[i];
    h[base + i] = ToBf(x[base + i] * inv2 * g);
  }
}

// Blocks of (token, a group of heads), one warp per head at a time. The
// groups per token follow the token count: a decode step's 64 tokens need
// several blocks per token or most SMs sit idle; a 2,048-token prefill with
// a block per (token, 4 heads) ran 24,576 blocks that each paid the metadata
// and cache-table latency for a few hundred bytes (43 us per layer, ncu).
constexpr int kQkvPostWarps = 8;
dim3 QkvPostGrid(int tokens, int heads) {
  const int groups = (heads + kQkvPostWarps - 1) / kQkvPostWarps;
  const int want = (512 + tokens - 1) / tokens;
  return dim3(tokens, std::max(1, std::min(groups, want)));
}
__device__ __forceinline__ float In(float v) { return v; }
__device__ __forceinline__ float In(bf16_t v) { return Bf(v); }
template <typename TIn>
__global__ void QkvPostKernel(const TIn* qkv, const float* bias, const float* q_norm,
                              const float* k_norm, const float* inv_freq, const int32_t* pos,
                              int nh, int nkv, int D, float eps, bool plus_one, bf16_t* q,
                              bf16_t* k, bf16_t* v, const int32_t* tok_seq, KvCacheView c) {
  PdlLaunchDependents();
  PdlWait();
  const int t = blockIdx.x;
  bf16_t* ck = CacheRow(c, tok_seq, t, pos[t], nkv, D);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int heads = nh + 2 * nkv;
  const TIn* row = qkv + static_cast<int64_t>(t) * heads * D;
  const float p = static_cast<float>(pos[t]);
  const int half = D / 2;
  for (int hh = blockIdx.y * nw + warp; hh < heads; hh += gridDim.y * nw) {
    const TIn* src = row + static_cast<int64_t>(hh) * D;
    const float* b = bias ? bias + static_cast<int64_t>(hh) * D : nullptr;
    const HeadRoute r = RouteHead(hh, t, nh, nkv, D, c.block_size, q, k, v, q_norm, k_norm, ck);
    bf16_t* dst = r.dst;
    const float* nw_ = r.norm;
    if (!r.rotary) {
      for (int i = lane; i < D; i += 32) {
        const bf16_t val = ToBf(In(src[i]) + (b ? b[i] : 0.f));
        dst[i] = val;
        if (r.cache) r.cache[i] = val;
      }
      continue;
    }
    float inv = 1.f;
    if (nw_) {
      float ss = 0.f;
      for (int i = lane; i < D; i += 32) {
        const float x = In(src[i]) + (b ? b[i] : 0.f);
        ss += x * x;
      }
      ss = WarpSum(ss);
      inv = 1.0f / sqrtf(ss / D + eps);
    }
    for (int i = lane; i < half; i += 32) {
      float x0 = In(src[i]) + (b ? b[i] : 0.f);
      float x1 = In(src[i + half]) + (b ? b[i + half] : 0.f);
      if (nw_) {
        x0 = x0 * inv * (plus_one ? 1.f + nw_[i] : nw_[i]);
        x1 = x1 * inv * (plus_one ? 1.f + nw_[i + half] : nw_[i + half]);
      }
      float sn, cs;
      sincosf(p * inv_freq[i], &sn, &cs);
      const bf16_t r0 = ToBf(x0 * cs - x1 * sn), r1 = ToBf(x1 * cs + x0 * sn);
      dst[i] = r0;
      dst[i + half] = r1;
      if (r.cache) {
        r.cache[i] = r0;
        r.cache[i + half] = r1;
      }
    }
  }
}

// QkvPostKernel for head_dim 64, 128 and 256, with the same arithmetic: a
// warp issues the loads of up to kQkvPostChunk of its heads before it
// finishes any, and looks up the token's cache row meanwhile. The generic
// kernel waited on one head's loads at a time (six round trips per warp in
// a prefill step, 32 us per layer at 2,048 tokens for ~13 us of traffic).
constexpr int kQkvPostChunk = 4;
template <int D, typename TIn>
__global__ void __launch_bounds__(32 * kQkvPostWarps)
    QkvPostKernelD(const TIn* qkv, const float* bias, const float* q_norm, const float* k_norm,
                   const float* inv_freq, const int32_t* pos, int nh, int nkv, int /*D*/, float eps,
                   bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v, const int32_t* tok_seq,
                   KvCacheView c) {
  PdlLaunchDependents();
  PdlWait();
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int heads = nh + 2 * nkv;
  const int stride = gridDim.y * kQkvPostWarps;
  const TIn* row = qkv + static_cast<int64_t>(t) * heads * D;
  const int pt = pos[t];
  bf16_t* ck = nullptr;
  bool looked = false;
  RotaryRegs<D> rot;
  for (int h0 = blockIdx.y * kQkvPostWarps + warp; h0 < heads; h0 += kQkvPostChunk * stride) {
    HeadRegs<D> r[kQkvPostChunk];
#pragma unroll
    for (int j = 0; j < kQkvPostChunk; ++j) {
      const int hh = h0 + j * stride;
      if (hh < heads)
        LoadHead<D>(row + static_cast<int64_t>(hh) * D,
                    bias ? bias + static_cast<int64_t>(hh) * D : nullptr, r[j], lane);
    }
    if (!looked) {  // while the loads are in flight
      looked = true;
      ck = CacheRow(c, tok_seq, t, pt, nkv, D);
      RotaryAt<D>(inv_freq, static_cast<float>(pt), rot, lane);
    }
#pragma unroll
    for (int j = 0; j < kQkvPostChunk; ++j) {
      const int hh = h0 + j * stride;
      if (hh >= heads) break;
      const HeadRoute to = RouteHead(hh, t, nh, nkv, D, c.block_size, q, k, v, q_norm, k_norm, ck);
      FinishHead<D>(r[j], to.norm, eps, plus_one, inv_freq, static_cast<float>(pt), to.rotary,
                    reinterpret_cast<__nv_bfloat16*>(to.dst),
                    reinterpret_cast<__nv_bfloat16*>(to.cache), lane, &rot);
    }
  }
}

// QkvPost of a bf16 projection at head_dim 64 (prompt steps): a warp a
// token, eight lanes a head, each lane four elements of either half, in
// 8-byte loads and stores, and the token's sines and cosines once a lane.
// QkvPostKernelD (ncu, a 6,656-token step) took 52.8 us at 1.46 TB/s with
// its issue slots 73% busy: 2-byte accesses, and the rotary once for each
// of a token's eight warps. Same element arithmetic; the q/k norms' sums
// of squares add in another order. k and v may be null: the step's
// attention reads its keys from the cache (AttentionReadsCacheOnly).
constexpr int kQkvVecTokens = 8;  // warps (tokens) a block
__global__ void __launch_bounds__(32 * kQkvVecTokens)
    QkvPostVecKernel(const bf16_t* qkv, const float* bias, const float* q_norm, const float* k_norm,
                     const float* inv_freq, const int32_t* pos, int tokens, int nh, int nkv,
                     float eps, bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v,
                     const int32_t* tok_seq, KvCacheView c) {
  constexpr int D = 64, kHalf = D / 2, kRounds = 3;
  PdlLaunchDependents();
  PdlWait();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kQkvVecTokens + (threadIdx.x >> 5);
  if (t >= tokens) return;
  const int e0 = 4 * (lane & 7), slot = lane >> 3;  // elements e0.. and kHalf + e0..
  const int heads = nh + 2 * nkv;
  const int pt = pos[t];
  const bf16_t* row = qkv + static_cast<int64_t>(t) * heads * D;
  bf16_t* ck = CacheRow(c, tok_seq, t, pt, nkv, D);
  float sn[4], cs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) sincosf(static_cast<float>(pt) * inv_freq[e0 + j], &sn[j], &cs[j]);
  auto unpack = [](uint32_t w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  };
  auto pack = [](float lo, float hi) {
    return static_cast<uint32_t>(ToBf(lo)) | (static_cast<uint32_t>(ToBf(hi)) << 16);
  };
  // Four heads a round (one an eight-lane group), kRounds rounds' loads in
  // flight. Every lane takes part in every shuffle: a group past the last
  // head computes on zeros and stores nothing.
  for (int h0 = 0; h0 < heads; h0 += 4 * kRounds) {
    uint2 a[kRounds], b[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      const int hh = h0 + 4 * u + slot;
      a[u] = b[u] = make_uint2(0, 0);
      if (hh < heads) {
        a[u] = *reinterpret_cast<const uint2*>(row + hh * D + e0);
        b[u] = *reinterpret_cast<const uint2*>(row + hh * D + kHalf + e0);
      }
    }
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      const int hh = h0 + 4 * u + slot;
      const bool live = hh < heads;
      float x0[4], x1[4];
      unpack(a[u].x, x0[0], x0[1]);
      unpack(a[u].y, x0[2], x0[3]);
      unpack(b[u].x, x1[0], x1[1]);
      unpack(b[u].y, x1[2], x1[3]);
      if (bias != nullptr && live) {
        const float* bh = bias + hh * D;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          x0[j] += bh[e0 + j];
          x1[j] += bh[kHalf + e0 + j];
        }
      }
      const HeadRoute r =
          live ? RouteHead(hh, t, nh, nkv, D, c.block_size, q, k, v, q_norm, k_norm, ck)
               : HeadRoute{nullptr, nullptr, nullptr, false};
      const bool is_k = hh >= nh && hh < nh + nkv, is_v = hh >= nh + nkv;
      bf16_t* dst = (is_k && k == nullptr) || (is_v && v == nullptr) ? nullptr : r.dst;
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) ss += x0[j] * x0[j] + x1[j] * x1[j];
      ss += __shfl_xor_sync(0xffffffffu, ss, 4);
      ss += __shfl_xor_sync(0xffffffffu, ss, 2);
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      if (!live) continue;
      if (r.rotary) {
        if (r.norm != nullptr) {
          const float inv = 1.0f / sqrtf(ss / D + eps);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float w0 = r.norm[e0 + j], w1 = r.norm[kHalf + e0 + j];
            x0[j] = x0[j] * inv * (plus_one ? 1.f + w0 : w0);
            x1[j] = x1[j] * inv * (plus_one ? 1.f + w1 : w1);
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float r0 = x0[j] * cs[j] - x1[j] * sn[j], r1 = x1[j] * cs[j] + x0[j] * sn[j];
          x0[j] = r0;
          x1[j] = r1;
        }
      }
      const uint2 lo = make_uint2(pack(x0[0], x0[1]), pack(x0[2], x0[3]));
      const uint2 hi = make_uint2(pack(x1[0], x1[1]), pack(x1[2], x1[3]));
      if (dst != nullptr) {
        *reinterpret_cast<uint2*>(dst + e0) = lo;
        *reinterpret_cast<uint2*>(dst + kHalf + e0) = hi;
      }
      if (r.cache != nullptr) {
        *reinterpret_cast<uint2*>(r.cache + e0) = lo;
        *reinterpret_cast<uint2*>(r.cache + kHalf + e0) = hi;
      }
    }
  }
}

// The kernel for head_dim D and the projection's type: the specialised one
// where there is one.
template <typename TIn>
using QkvPostFn = void (*)(const TIn*, const float*, const float*, const float*, const float*,
                           const int32_t*, int, int, int, float, bool, bf16_t*, bf16_t*, bf16_t*,
                           const int32_t*, KvCacheView);
template <typename TIn>
QkvPostFn<TIn> QkvPostFor(int D) {
  switch (D) {
    case 64:
      return QkvPostKernelD<64, TIn>;
    case 128:
      return QkvPostKernelD<128, TIn>;
    case 256:
      return QkvPostKernelD<256, TIn>;
    default:
      return QkvPostKernel<TIn>;
  }
}

// One block per token; 16-byte vectors when head_dim allows.
__global__ void KvStoreKernel(const bf16_t* k, const bf16_t* v, const int32_t* pos,
                              const int32_t* tok_seq, const int32_t* seq_start,
                              const int32_t* seq_first, int nkv, int D, KvCacheView c) {
  PdlLaunchDependents();
  PdlWait();
  const int t = blockIdx.x;
  const int p = pos[t];
  if (p < 0) return;
  const int s = tok_seq[t];
  if (c.ring > 0) {
    // Blocks run in any order: of the step's tokens that share a ring slot,
    // only the newest writes (as a sequential store would leave it).
    const int end = seq_start[s] + (seq_first[s + 1] - seq_first[s]);
    if (p + c.ring * c.block_size < end) return;
  }
  const int64_t row = static_cast<int64_t>(nkv) * D;
  bf16_t* kd = CacheRow(c, tok_seq, t, p, nkv, D);
  bf16_t* vd = kd + static_cast<int64_t>(c.block_size) * row;
  const bf16_t* ks = k + t * row;
  const bf16_t* vs = v + t * row;
  if (row % 8 == 0) {
    for (int i = threadIdx.x; i < row / 8; i += blockDim.x) {
      reinterpret_cast<uint4*>(kd)[i] = reinterpret_cast<const uint4*>(ks)[i];
      reinterpret_cast<uint4*>(vd)[i] = reinterpret_cast<const uint4*>(vs)[i];
    }
  } else {
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
      kd[i] = ks[i];
      vd[i] = vs[i];
    }
  }
}

// Rows of gate_up hold gate and up interleaved: [g0, u0, g1, u1, ...].
__global__ void GatedActKernel(const bf16_t* gu, bf16_t* out, int n, int act) {
  PdlLaunchDependents();
  PdlWait();
  const int64_t r = blockIdx.y;
  const bf16_t* row = gu + r * 2 * n;
  bf16_t* o = out + r * n;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    o[i] = ToBf(Activate(Bf(row[2 * i]), act) * Bf(row[2 * i + 1]));
}

// GatedActKernel with 16-byte loads (four gate/up pairs) and 8-byte stores
// per thread and iteration (n a multiple of 4). The scalar kernel moved 2
// bytes per access and ran at ~40% of the copy bandwidth on prefill rows.
// V 16-byte loads per thread, all issued before the first is used: with one
// per thread a 7,168-row prefill step's activation ran at 2.5 TB/s (140 us;
// 4: -18% a row). Steps of few rows keep one, for more blocks.
template <int V>
__global__ void GatedActVecKernel(const bf16_t* gu, bf16_t* out, int n, int act) {
  PdlLaunchDependents();
  PdlWait();
  const int64_t r = blockIdx.y;
  const uint4* in = reinterpret_cast<const uint4*>(gu + r * 2 * n);
  uint2* o = reinterpret_cast<uint2*>(out + r * n);
  const int nv = n / 4;
  for (int i0 = blockIdx.x * blockDim.x * V + threadIdx.x; i0 < nv;
       i0 += gridDim.x * blockDim.x * V) {
    uint4 v[V];
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int i = i0 + u * blockDim.x;
      v[u] = i < nv ? in[i] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const int i = i0 + u * blockDim.x;
      if (i >= nv) break;
      uint2 ov;
      const bf16_t* e = reinterpret_cast<const bf16_t*>(&v[u]);
      bf16_t* oe = reinterpret_cast<bf16_t*>(&ov);
#pragma unroll
      for (int j = 0; j < 4; ++j) oe[j] = ToBf(Activate(Bf(e[2 * j]), act) * Bf(e[2 * j + 1]));
      o[i] = ov;
    }
  }
}

__global__ void SoftcapKernel(float* x, int64_t n, float cap) {
  PdlLaunchDependents();
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

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

// RmsNormVecKernel after the residual add of a GEMM whose K was split into
// nparts fp32 planes: x[src] += planes[0][src] + ... (in plane order, so the
// sum is deterministic), written back to x, then normalised. One row per
// block; every plane's float4 of a thread is requested before any is added.
// At most 512 threads of 128 registers (16 planes' float4s in flight).
// Decode steps wait on this kernel twice a layer, so its own latency is the
// step's: the norm weights and the row index (written by no kernel of the
// step) are read before the wait, and rows of one float4 per thread (2,048
// floats at 512 threads) stay in registers between the two passes (longer
// rows re-read their sums, from L1; two float4s per thread spilled).
// kParts bounds nparts: the planes' float4s held at once set the registers
// (kParts 16: 104 a thread, 53K a block; 8: 64, 32K), and a block of 53K
// left no room on its SM for the warpgroup GEMM blocks around it (12K
// registers each): the next GEMM's blocks could not become resident, and
// request their first weights, until the norm ended, nor could the norm's
// blocks start beside the two blocks of the GEMM before it.
constexpr int kMaxParts = kMaxWgmmaSplits;
template <int kParts>
__global__ void __launch_bounds__(512)
    AddPartsRmsNormKernel(float* x, const float* parts, int nparts, int64_t plane,
                          const int32_t* rows_idx, const float* w, bf16_t* out, int dim, float eps,
                          bool plus_one) {
  PdlLaunchDependents();
  __shared__ float red[32];
  const int nv = dim / 4;
  const int tid = threadIdx.x;
  const bool in_regs = nv <= static_cast<int>(blockDim.x);
  const float4* wv = reinterpret_cast<const float4*>(w);
  const float4 g = in_regs && tid < nv ? __ldg(wv + tid) : make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t src = rows_idx ? rows_idx[blockIdx.x] : blockIdx.x;
  PdlWait();
  float4* xr = reinterpret_cast<float4*>(x + src * dim);
  const float4* pr = reinterpret_cast<const float4*>(parts + src * dim);
  const int64_t pv = plane / 4;
  // x[i] += the planes' float4s at i; returns the sum, written back.
  auto add = [&](int i) {
    float4 p[kParts];
#pragma unroll
    for (int q = 0; q < kParts; ++q)
      if (q < nparts) p[q] = pr[q * pv + i];
    float4 v = xr[i];
#pragma unroll
    for (int q = 0; q < kParts; ++q)
      if (q < nparts) {
        v.x += p[q].x;
        v.y += p[q].y;
        v.z += p[q].z;
        v.w += p[q].w;
      }
    xr[i] = v;
    return v;
  };
  auto store = [&](int i, float4 v, float4 gi, float inv) {
    if (plus_one) gi = make_float4(1.f + gi.x, 1.f + gi.y, 1.f + gi.z, 1.f + gi.w);
    const uint32_t lo = static_cast<uint32_t>(ToBf(v.x * inv * gi.x)) |
                        static_cast<uint32_t>(ToBf(v.y * inv * gi.y)) << 16;
    const uint32_t hi = static_cast<uint32_t>(ToBf(v.z * inv * gi.z)) |
                        static_cast<uint32_t>(ToBf(v.w * inv * gi.w)) << 16;
    reinterpret_cast<uint2*>(out + static_cast<int64_t>(blockIdx.x) * dim)[i] = make_uint2(lo, hi);
  };
  float ss = 0.f;
  if (in_regs) {
    const float4 v = tid < nv ? add(tid) : make_float4(0.f, 0.f, 0.f, 0.f);
    ss = BlockSum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w, red);
    if (tid < nv) store(tid, v, g, 1.0f / sqrtf(ss / dim + eps));
    return;
  }
#pragma unroll 1
  for (int i = tid; i < nv; i += blockDim.x) {
    const float4 v = add(i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  for (int i = tid; i < nv; i += blockDim.x) store(i, xr[i], __ldg(wv + i), inv);
}

// Row counts from which the norm and activation kernels give each thread
// several vectors (prefill steps); decode-sized steps keep more blocks.
constexpr int kManyRows = 256;

int NormThreads(int dim) { return dim >= 1024 ? 512 : dim >= 256 ? 256 : 128; }

// SetPdlLaunches's setting.
std::atomic<bool> pdl_launches{true};

}  // namespace

void SetPdlLaunches(bool on) { pdl_launches.store(on, std::memory_order_relaxed); }

bool PdlEnabled() {
  // The device's compute capability, asked once.
  static const bool supported = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return supported && pdl_launches.load(std::memory_order_relaxed);
}

cudaError_t LaunchEmbed(const bf16_t* embed, const int32_t* tokens, const int32_t* picks, int rows,
                        int dim, float scale, float* x, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const bool vec = dim % 8 == 0 && reinterpret_cast<uintptr_t>(embed) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  return LaunchPdl(EmbedKernel, dim3(rows), dim3(256), 0, stream, embed, tokens, picks, dim, scale,
                   x, vec);
}

cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows_idx, const float* w, bf16_t* out,
                          int rows, int dim, float eps, bool plus_one, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = NormThreads(dim);
  if (dim % 4 == 0 && dim <= threads * 4 * kNormVec) {
    // Many rows: kNormVec float4 loads per thread, in fewer and fuller
    // blocks (with one per thread a 7,168-row prefill step's norm ran at
    // 1.9 TB/s, 51 us; -38% a row). Few rows keep the wide blocks.
    const int vec_threads = rows >= kManyRows
                                ? std::max(32, (dim / 4 + kNormVec * 32 - 1) / (kNormVec * 32) * 32)
                                : threads;
    return LaunchPdl(RmsNormVecKernel, dim3(rows), dim3(vec_threads), 0, stream, x, rows_idx, w,
                     out, dim, eps, plus_one);
  }
  return LaunchPdl(RmsNormKernel, dim3(rows), dim3(threads), 0, stream, x, rows_idx, w, out, dim,
                   eps, plus_one);
}

bool AddPartsRmsNormSupported(int dim, int nparts) {
  return dim % 4 == 0 && nparts >= 1 && nparts <= kMaxParts;
}

cudaError_t LaunchAddPartsRmsNorm(float* x, const float* parts, int nparts, int64_t plane,
                                  const int32_t* rows_idx, const float* w, bf16_t* out, int rows,
                                  int dim, float eps, bool plus_one, cudaStream_t stream) {
  if (!AddPartsRmsNormSupported(dim, nparts) || plane % 4 != 0) return cudaErrorInvalidValue;
  if (rows <= 0) return cudaSuccess;
  auto* kernel = nparts > 8   ? AddPartsRmsNormKernel<kMaxParts>
                 : nparts > 4 ? AddPartsRmsNormKernel<8>
                              : AddPartsRmsNormKernel<4>;
  return LaunchPdl(kernel, dim3(rows), dim3(NormThreads(dim)), 0, stream, x, parts, nparts, plane,
                   rows_idx, w, out, dim, eps, plus_one);
}

cudaError_t LaunchAddNormed(const float* o, const float* w_post, float* x, const float* w_pre,
                            bf16_t* h, int rows, int dim, float eps, bool plus_one,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return LaunchPdl(AddNormedKernel, dim3(rows), dim3(NormThreads(dim)), 0, stream, o, w_post, x,
                   w_pre, h, dim, eps, plus_one);
}

template <typename TIn>
cudaError_t LaunchQkvPostStore(const TIn* qkv, const float* bias, const float* q_norm,
                               const float* k_norm, const float* inv_freq, const int32_t* pos,
                               const int32_t* tok_seq, int tokens, int nh, int nkv, int head_dim,
                               float eps, bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v,
                               const KvCacheView& cache, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if constexpr (std::is_same_v<TIn, bf16_t>) {
    if (head_dim == 64)
      return LaunchPdl(QkvPostVecKernel, dim3((tokens + kQkvVecTokens - 1) / kQkvVecTokens),
                       dim3(32 * kQkvVecTokens), 0, stream, qkv, bias, q_norm, k_norm, inv_freq,
                       pos, tokens, nh, nkv, eps, plus_one, q, k, v, tok_seq, cache);
  }
  if (k == nullptr || v == nullptr) return cudaErrorInvalidValue;  // (QkvPostVecKernel only)
  const dim3 grid = QkvPostGrid(tokens, nh + 2 * nkv);
  return LaunchPdl(QkvPostFor<TIn>(head_dim), grid, dim3(32 * kQkvPostWarps), 0, stream, qkv, bias,
                   q_norm, k_norm, inv_freq, pos, nh, nkv, head_dim, eps, plus_one, q, k, v,
                   tok_seq, cache);
}
template <typename TIn>
cudaError_t LaunchQkvPost(const TIn* qkv, const float* bias, const float* q_norm,
                          const float* k_norm, const float* inv_freq, const int32_t* pos,
                          int tokens, int nh, int nkv, int head_dim, float eps, bool plus_one,
                          bf16_t* q, bf16_t* k, bf16_t* v, cudaStream_t stream) {
  return LaunchQkvPostStore(qkv, bias, q_norm, k_norm, inv_freq, pos, nullptr, tokens, nh, nkv,
                            head_dim, eps, plus_one, q, k, v, KvCacheView{}, stream);
}
#define AGENTKV_QKV_POST(T)                                                                      \
  template cudaError_t LaunchQkvPost<T>(const T*, const float*, const float*, const float*,      \
                                        const float*, const int32_t*, int, int, int, int, float, \
                                        bool, bf16_t*, bf16_t*, bf16_t*, cudaStream_t);          \
  template cudaError_t LaunchQkvPostStore<T>(const T*, const float*, const float*, const float*, \
                                             const float*, const int32_t*, const int32_t*, int,  \
                                             int, int, int, float, bool, bf16_t*, bf16_t*,       \
                                             bf16_t*, const KvCacheView&, cudaStream_t);
AGENTKV_QKV_POST(float)
AGENTKV_QKV_POST(bf16_t)
#undef AGENTKV_QKV_POST

cudaError_t LaunchKvStore(const bf16_t* k, const bf16_t* v, const int32_t* pos,
                          const int32_t* tok_seq, const int32_t* seq_start,
                          const int32_t* seq_first, int tokens, int nkv, int head_dim,
                          const KvCacheView& cache, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  return LaunchPdl(KvStoreKernel, dim3(tokens), dim3(128), 0, stream, k, v, pos, tok_seq, seq_start,
                   seq_first, nkv, head_dim, cache);
}

cudaError_t LaunchGatedAct(const bf16_t* gate_up, bf16_t* out, int rows, int n, int act,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (n % 4 == 0) {
    const bool wide = rows >= kManyRows;
    const int per = wide ? 128 * 4 : 128, nv = n / 4;
    const int bx = std::min(64, (nv + per - 1) / per);
    return LaunchPdl(wide ? GatedActVecKernel<4> : GatedActVecKernel<1>, dim3(bx, rows), dim3(128),
                     0, stream, gate_up, out, n, act);
  }
  const int bx = (n + 255) / 256 < 64 ? (n + 255) / 256 : 64;
  return LaunchPdl(GatedActKernel, dim3(bx, rows), dim3(256), 0, stream, gate_up, out, n, act);
}

cudaError_t LaunchSoftcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(SoftcapKernel, dim3(GridFor(n, 256)), dim3(256), 0, stream, x, n, cap);
}

cudaError_t LaunchArgmax(const float* x, int rows, int cols, int32_t* out, void* scratch,
                         cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  float2* part = static_cast<float2*>(scratch);
  cudaError_t e =
      LaunchPdl(ArgmaxPartKernel, dim3(kArgmaxChunks, rows), dim3(256), 0, stream, x, cols, part);
  if (e != cudaSuccess) return e;
  return LaunchPdl(ArgmaxKernel, dim3(rows), dim3(64), 0, stream, part, kArgmaxChunks, out);
}

cudaError_t LaunchArgmaxOfParts(const void* parts, int rows, int chunks, int32_t* out,
                                cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (chunks <= 0) return cudaErrorInvalidValue;
  return LaunchPdl(ArgmaxKernel, dim3(rows), dim3(chunks > 64 ? 256 : 64), 0, stream,
                   static_cast<const float2*>(parts), chunks, out);
}

cudaError_t LaunchF32ToBf16(const float* in, bf16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(F32ToBf16Kernel, dim3(GridFor(n, 256)), dim3(256), 0, stream, in, out, n);
}

cudaError_t LaunchBf16ToF32(const bf16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(Bf16ToF32Kernel, dim3(GridFor(n, 256)), dim3(256), 0, stream, in, out, n);
}

cudaError_t LaunchFill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchPdl(FillKernel, dim3(GridFor(n, 256)), dim3(256), 0, stream, x, n, value);
}

}  // namespace agentkv::cuda
