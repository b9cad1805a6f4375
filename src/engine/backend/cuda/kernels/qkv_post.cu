// QkvPost (bias, q/k norms, rotary) and the bf16 KV store kernels
// (qkv_post.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/head_projection.cuh"
#include "engine/backend/cuda/kernels/head_route.h"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;

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
                              const float* k_norm, const float* inv_freq, float rope_factor,
                              const int32_t* pos, int nh, int nkv, int D, float eps, bool plus_one,
                              bf16_t* q, bf16_t* k, bf16_t* v, const int32_t* tok_seq,
                              KvCacheView c) {
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
      sn *= rope_factor;
      cs *= rope_factor;
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
                   const float* inv_freq, float rope_factor, const int32_t* pos, int nh, int nkv,
                   int /*D*/, float eps, bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v,
                   const int32_t* tok_seq, KvCacheView c) {
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
      RotaryAt<D>(inv_freq, rope_factor, static_cast<float>(pt), rot, lane);
    }
#pragma unroll
    for (int j = 0; j < kQkvPostChunk; ++j) {
      const int hh = h0 + j * stride;
      if (hh >= heads) break;
      const HeadRoute to = RouteHead(hh, t, nh, nkv, D, c.block_size, q, k, v, q_norm, k_norm, ck);
      FinishHead<D>(r[j], to.norm, eps, plus_one, inv_freq, rope_factor, static_cast<float>(pt),
                    to.rotary, reinterpret_cast<__nv_bfloat16*>(to.dst),
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
                     const float* inv_freq, float rope_factor, const int32_t* pos, int tokens,
                     int nh, int nkv, float eps, bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v,
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
  for (int j = 0; j < 4; ++j) {
    sincosf(static_cast<float>(pt) * inv_freq[e0 + j], &sn[j], &cs[j]);
    sn[j] *= rope_factor;
    cs[j] *= rope_factor;
  }
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
                           float, const int32_t*, int, int, int, float, bool, bf16_t*, bf16_t*,
                           bf16_t*, const int32_t*, KvCacheView);
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

}  // namespace

template <typename TIn>
cudaError_t LaunchQkvPostStore(const TIn* qkv, const float* bias, const float* q_norm,
                               const float* k_norm, const float* inv_freq, float rope_factor,
                               const int32_t* pos, const int32_t* tok_seq, int tokens, int nh,
                               int nkv, int head_dim, float eps, bool plus_one, bf16_t* q,
                               bf16_t* k, bf16_t* v, const KvCacheView& cache,
                               LaunchConfig launch) {
  if (tokens <= 0) return cudaSuccess;
  if constexpr (std::is_same_v<TIn, bf16_t>) {
    if (head_dim == 64)
      return LaunchPdl(QkvPostVecKernel, dim3((tokens + kQkvVecTokens - 1) / kQkvVecTokens),
                       dim3(32 * kQkvVecTokens), 0, launch, qkv, bias, q_norm, k_norm, inv_freq,
                       rope_factor, pos, tokens, nh, nkv, eps, plus_one, q, k, v, tok_seq, cache);
  }
  if (k == nullptr || v == nullptr) return cudaErrorInvalidValue;  // (QkvPostVecKernel only)
  const dim3 grid = QkvPostGrid(tokens, nh + 2 * nkv);
  return LaunchPdl(QkvPostFor<TIn>(head_dim), grid, dim3(32 * kQkvPostWarps), 0, launch, qkv, bias,
                   q_norm, k_norm, inv_freq, rope_factor, pos, nh, nkv, head_dim, eps, plus_one, q,
                   k, v, tok_seq, cache);
}
template <typename TIn>
cudaError_t LaunchQkvPost(const TIn* qkv, const float* bias, const float* q_norm,
                          const float* k_norm, const float* inv_freq, float rope_factor,
                          const int32_t* pos, int tokens, int nh, int nkv, int head_dim, float eps,
                          bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v, LaunchConfig launch) {
  return LaunchQkvPostStore(qkv, bias, q_norm, k_norm, inv_freq, rope_factor, pos, nullptr, tokens,
                            nh, nkv, head_dim, eps, plus_one, q, k, v, KvCacheView{}, launch);
}
#define AGENTKV_QKV_POST(T)                                                                       \
  template cudaError_t LaunchQkvPost<T>(const T*, const float*, const float*, const float*,       \
                                        const float*, float, const int32_t*, int, int, int, int,  \
                                        float, bool, bf16_t*, bf16_t*, bf16_t*, LaunchConfig);    \
  template cudaError_t LaunchQkvPostStore<T>(const T*, const float*, const float*, const float*,  \
                                             const float*, float, const int32_t*, const int32_t*, \
                                             int, int, int, int, float, bool, bf16_t*, bf16_t*,   \
                                             bf16_t*, const KvCacheView&, LaunchConfig);
AGENTKV_QKV_POST(float)
AGENTKV_QKV_POST(bf16_t)
#undef AGENTKV_QKV_POST

cudaError_t LaunchKvStore(const bf16_t* k, const bf16_t* v, const int32_t* pos,
                          const int32_t* tok_seq, const int32_t* seq_start,
                          const int32_t* seq_first, int tokens, int nkv, int head_dim,
                          const KvCacheView& cache, LaunchConfig launch) {
  if (tokens <= 0) return cudaSuccess;
  return LaunchPdl(KvStoreKernel, dim3(tokens), dim3(128), 0, launch, k, v, pos, tok_seq, seq_start,
                   seq_first, nkv, head_dim, cache);
}

}  // namespace agentkv::backend::cuda::kernels
