// Paged attention, flash-style: one thread block takes 16 query rows (the
// G = nh / nkv query heads of 16 / G consecutive tokens of one sequence, all
// sharing one KV head) and walks its keys 32 at a time, double-buffered with
// cp.async, scores and P.V on the tensor cores (WMMA bf16 -> fp32), online
// softmax in fp32. Long key ranges are split over gridDim.z blocks whose
// partial (max, sum, unnormalised output) a second kernel merges.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/kv_route.h"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace nvcuda;

constexpr int kRows = 16;  // query rows per block
constexpr int kKeys = 32;  // keys per tile
constexpr int kThreads = 128;
constexpr int kSP = kKeys + 4;  // score row stride (floats)
constexpr int kPP = kKeys + 8;  // probability row stride (bf16)

size_t SmemBytes(int D) {
  const size_t DP = D + 8, OP = D + 4;
  return (kRows * DP + 4 * kKeys * DP) * sizeof(bf16) + 2 * kRows * kSP * sizeof(float) +
         kRows * kPP * sizeof(bf16) + kRows * OP * sizeof(float);
}

__global__ void __launch_bounds__(kThreads) AttentionKernel(const AttentionParams p) {
  PdlLaunchDependents();
  PdlWait();
  extern __shared__ __align__(128) unsigned char smem[];
  const int D = p.head_dim, DP = D + 8, OP = D + 4;
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  // Buffer b: K at Ks + b * kKeys * DP, V at Vs + b * kKeys * DP.
  bf16* Ks = Qs + kRows * DP;
  bf16* Vs = Ks + 2 * kKeys * DP;
  float* S = reinterpret_cast<float*>(Qs + kRows * DP + 4 * kKeys * DP);
  bf16* P = reinterpret_cast<bf16*>(S + 2 * kRows * kSP);
  float* O = reinterpret_cast<float*>(P + kRows * kPP);

  const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int n = p.tile_n[tile];
  if (n <= 0) return;
  const int s = p.tile_seq[tile], t0 = p.tile_t0[tile];
  const int G = p.nh / p.nkv;
  const int tpt = kRows / G;
  const int start = p.seq_start[s], first = p.seq_first[s];
  const int p0 = p.pos[t0], p1 = p.pos[t0 + n - 1];
  const int lo = p.window > 0 ? max(0, p0 - p.window + 1) : 0;
  const int hi = p1 + 1;
  const int chunk = ((hi - lo + p.splits - 1) / p.splits + kKeys - 1) / kKeys * kKeys;
  const int kb = lo + split * chunk;
  const int ke = min(hi, kb + chunk);

  const int tid = threadIdx.x, warp = tid >> 5;
  const int row = tid >> 3, sub = tid & 7;  // softmax: 8 threads per row
  const int rtok = row / G, rh = row % G;
  const bool rvalid = rtok < tpt && rtok < n;
  const int rpos = rvalid ? p.pos[t0 + rtok] : -1;
  const int64_t out_row = rvalid ? (static_cast<int64_t>(t0 + rtok) * p.nh + kvh * G + rh) : 0;

  if (kb >= ke) {  // an empty split: contributes nothing
    if (rvalid) {
      const int64_t b = out_row * p.splits + split;
      for (int d = sub; d < D; d += 8) p.part_o[b * D + d] = 0.f;
      if (sub == 0) {
        p.part_ml[b * 2] = -INFINITY;
        p.part_ml[b * 2 + 1] = 0.f;
      }
    }
    return;
  }

  LoadQueryTile(p, t0, n, tpt, kvh, kRows, DP, Qs, tid, kThreads);
  for (int i = tid; i < kRows * OP; i += kThreads) O[i] = 0.f;

  KvLoader ld(p, s, kvh, start, first, ke, DP);
  auto issue = [&](int kt, int buf) {
    ld.Issue(kt, kKeys, Ks + buf * kKeys * DP, Vs + buf * kKeys * DP, tid, kThreads);
  };

  float m = -INFINITY, l = 0.f;
  const int ksteps = D / 16, khalf = (ksteps + 1) / 2;
  issue(kb, 0);
  int buf = 0;
  for (int kt = kb; kt < ke; kt += kKeys) {
    if (kt + kKeys < ke) {
      issue(kt + kKeys, buf ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    {  // S (two halves over head_dim) = Q K^T
      const int nt = warp & 1, kh = warp >> 1;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = kh * khalf; kk < min(ksteps, (kh + 1) * khalf); ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, Qs + kk * 16, DP);
        wmma::load_matrix_sync(b, Ks + buf * kKeys * DP + nt * 16 * DP + kk * 16, DP);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(S + kh * kRows * kSP + nt * 16, acc, kSP, wmma::mem_row_major);
    }
    __syncthreads();
    {  // online softmax, 8 threads per row, 4 keys each
      float sv[4];
      float tmax = -INFINITY;
#pragma unroll
      for (int j4 = 0; j4 < 4; ++j4) {
        const int j = sub * 4 + j4, kp = kt + j;
        float x = (S[row * kSP + j] + S[kRows * kSP + row * kSP + j]) * p.scale;
        if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
        const bool ok = rvalid && kp < ke && kp <= rpos && (p.window == 0 || kp > rpos - p.window);
        sv[j4] = ok ? x : -INFINITY;
        tmax = fmaxf(tmax, sv[j4]);
      }
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float m_new = fmaxf(m, tmax);
      const float alpha = m_new == -INFINITY ? 1.f : expf(m - m_new);
      float psum = 0.f;
#pragma unroll
      for (int j4 = 0; j4 < 4; ++j4) {
        const float pj = sv[j4] == -INFINITY ? 0.f : expf(sv[j4] - m_new);
        psum += pj;
        P[row * kPP + sub * 4 + j4] = __float2bfloat16_rn(pj);
      }
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l = l * alpha + psum;
      m = m_new;
      if (alpha != 1.f)
        for (int d = sub; d < D; d += 8) O[row * OP + d] *= alpha;
    }
    __syncthreads();
    for (int nt = warp; nt < ksteps; nt += kThreads / 32) {  // O += P V
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, O + nt * 16, OP, wmma::mem_row_major);
#pragma unroll
      for (int k2 = 0; k2 < kKeys / 16; ++k2) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, P + k2 * 16, kPP);
        wmma::load_matrix_sync(b, Vs + buf * kKeys * DP + k2 * 16 * DP + nt * 16, DP);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(O + nt * 16, acc, OP, wmma::mem_row_major);
    }
    __syncthreads();
    buf ^= 1;
  }

  if (!rvalid) return;
  if (p.splits == 1) {
    const float inv = SoftmaxNormaliser(m, l, p.sinks, kvh * G + rh);
    bf16* out = reinterpret_cast<bf16*>(p.out) + out_row * D;
    for (int d = sub; d < D; d += 8) out[d] = __float2bfloat16_rn(O[row * OP + d] * inv);
  } else {
    const int64_t b = out_row * p.splits + split;
    for (int d = sub; d < D; d += 8) p.part_o[b * D + d] = O[row * OP + d];
    if (sub == 0) {
      p.part_ml[b * 2] = m;
      p.part_ml[b * 2 + 1] = l;
    }
  }
}

// One block per (token, head), a thread per output element: merges the
// splits' partial results (splits <= kMaxS, 32 or 64). Each thread loads its
// element of every split while the first warp loads the splits' (max, sum),
// in one round trip (loading the partials after the weights made it two);
// the first warp turns them into weights (kMaxS / 32 splits a lane), then
// each thread adds its column.
template <int kMaxS>
__global__ void CombineKernel(const AttentionParams p) {
  static_assert(kMaxS % 32 == 0, "whole lanes' worth of splits");
  constexpr int kPer = kMaxS / 32;  // splits a lane of the first warp weighs
  PdlLaunchDependents();
  PdlWait();
  __shared__ float wts[kMaxS];
  __shared__ float inv_sum;
  const int t = blockIdx.x, h = blockIdx.y;
  if (p.pos[t] < 0) return;
  const int D = p.head_dim, S = p.splits;
  const int64_t b = (static_cast<int64_t>(t) * p.nh + h) * S;
  const int d = threadIdx.x;
  // Every split wrote its part_o (zeros when it had no keys), so all S are
  // read without a branch per split: the loads are independent.
  float po[kMaxS];
#pragma unroll
  for (int i = 0; i < kMaxS; ++i) po[i] = d < D && i < S ? p.part_o[(b + i) * D + d] : 0.f;
  if (threadIdx.x < 32) {
    float mi[kPer], li[kPer];
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + 32 * k;
      mi[k] = i < S ? p.part_ml[(b + i) * 2] : -INFINITY;
      li[k] = i < S ? p.part_ml[(b + i) * 2 + 1] : 0.f;
      M = fmaxf(M, mi[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const float wi = mi[k] == -INFINITY ? 0.f : expf(mi[k] - M);
      L += wi * li[k];
      wts[threadIdx.x + 32 * k] = wi;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (threadIdx.x == 0) inv_sum = SoftmaxNormaliser(M, L, p.sinks, h);
  }
  __syncthreads();
  if (d >= D) return;
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxS; ++i) acc += wts[i] * po[i];
  bf16* out = reinterpret_cast<bf16*>(p.out) + (static_cast<int64_t>(t) * p.nh + h) * D;
  out[d] = __float2bfloat16_rn(acc * inv_sum);
}

}  // namespace

bool WideAttentionSupported(int head_dim) { return MmaAttentionSupported(head_dim); }

int TokensPerTile(int group_size, bool wide) {
  return group_size > 0 ? (wide ? 64 : kRows) / group_size : 0;
}

bool FusedRotarySupported(int head_dim) { return MmaAttentionSupported(head_dim); }

cudaError_t LaunchAttention(const AttentionParams& p, LaunchConfig launch) {
  if (p.num_tiles <= 0) return cudaSuccess;
  if (p.head_dim % 16 != 0 || p.head_dim > kMaxAttentionHeadDim || p.nkv <= 0 ||
      p.nh % p.nkv != 0 || p.nh / p.nkv > kRows || p.splits < 1 || p.splits > kMaxAttentionSplits)
    return cudaErrorInvalidValue;
  if (p.wide && !WideAttentionSupported(p.head_dim)) return cudaErrorInvalidValue;
  if (p.qkv != nullptr && (p.wide || !p.mma || !FusedRotarySupported(p.head_dim)))
    return cudaErrorInvalidValue;
  if (p.qkv_planes < 1 || p.qkv_planes > kMaxQkvPlanes || (p.qkv_planes > 1 && p.qkv == nullptr))
    return cudaErrorInvalidValue;
  cudaError_t e;
  if (p.cache.fp8) {
    // The mma.sync kernel with the fp8 tile loader where it has the
    // head_dim, the portable narrow-tile kernel elsewhere.
    e = RouteFp8Mma(p.wide, p.mma, MmaAttentionSupported(p.head_dim))
            ? LaunchMmaAttention(p, launch)
            : LaunchFp8Attention(p, launch);
  } else if (RouteBf16Mma(p.wide, p.mma, MmaAttentionSupported(p.head_dim))) {
    e = LaunchMmaAttention(p, launch);
  } else {
    const size_t smem = SmemBytes(p.head_dim);
    static PerDeviceOnce raised;  // (per device: the attribute is the context's)
    if (smem > 48 * 1024) {
      e = raised.Run([] {
        return cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(SmemBytes(kMaxAttentionHeadDim)));
      });
      if (e != cudaSuccess) return e;
    }
    e = LaunchPdl(AttentionKernel, dim3(p.num_tiles, p.nkv, p.splits), dim3(kThreads), smem, launch,
                  p);
  }
  if (e != cudaSuccess || p.splits == 1) return e;
  // (Up to 32 splits, what every bf16 step has, on the narrower form.)
  static_assert(kMaxAttentionSplits == 64, "the combine's forms");
  const dim3 grid(p.tokens, p.nh), block(std::max(32, p.head_dim));
  return p.splits <= 32 ? LaunchPdl(CombineKernel<32>, grid, block, 0, launch, p)
                        : LaunchPdl(CombineKernel<64>, grid, block, 0, launch, p);
}

}  // namespace agentkv::backend::cuda::kernels
