// Mixture-of-experts kernels (moe.h).
#include <cuda_bf16.h>
#include <mma.h>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/kernels/moe_plan.h"
#include "engine/backend/cuda/kernels/moe_quant.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;
using namespace nvcuda;
using bf16 = __nv_bfloat16;

// The router, a small GEMM [T x H] x [H x E]: a block takes TT tokens and
// kRouterWarps experts (a warp each), so a step has ceil(T / TT) x
// ceil(E / kRouterWarps) blocks. Each block normalises its tokens' rows
// into shared memory (fp32, a warp a token), then every warp streams its
// expert's weight row once (16-byte loads where H allows, the first ones
// issued before the PDL wait) against all TT rows. The norm is recomputed by each block of a token
// group: H floats from the L2, far less than the weight rows it meets.
constexpr int kRouterWarps = 4;
constexpr int kRouterPre = 8;
template <int TT>
__global__ void __launch_bounds__(kRouterWarps * 32)
    MoeRouterKernel(const float* x, const float* norm_w, float eps, bool plus_one, const bf16_t* w,
                    const float* bias, int tokens, int H, int E, float* logits) {
  extern __shared__ __align__(16) float xn[];  // [TT][H]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e = blockIdx.y * kRouterWarps + warp;
  // The expert's first kRouterPre loads go out before the wait (weights are
  // never written by a step): for H up to 2,048 the whole row.
  const bool vec = H % 8 == 0;
  const int nv = H / 8;
  const uint4* wv = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(e) * H);
  uint4 pre[kRouterPre];
#pragma unroll
  for (int i = 0; i < kRouterPre; ++i) {
    const int v = lane + 32 * i;
    pre[i] = vec && e < E && v < nv ? __ldg(wv + v) : make_uint4(0u, 0u, 0u, 0u);
  }
  PdlLaunchDependents();
  PdlWait();
  const int t0 = blockIdx.x * TT, nt = min(TT, tokens - t0);
  for (int r = warp; r < TT; r += kRouterWarps) {
    float* dst = xn + r * H;
    if (r >= nt) {  // (rows past the last token: zeros, never stored)
      for (int i = lane; i < H; i += 32) dst[i] = 0.f;
      continue;
    }
    const float* xr = x + static_cast<int64_t>(t0 + r) * H;
    float ss = 0.f;
#pragma unroll 8
    for (int i = lane; i < H; i += 32) {
      const float v = xr[i];
      dst[i] = v;
      ss += v * v;
    }
    ss = WarpSum(ss);
    const float inv = 1.0f / sqrtf(ss / H + eps);
    for (int i = lane; i < H; i += 32)
      dst[i] = dst[i] * inv * (plus_one ? 1.f + norm_w[i] : norm_w[i]);
  }
  __syncthreads();
  if (e >= E) return;
  float acc[TT];
#pragma unroll
  for (int r = 0; r < TT; ++r) acc[r] = 0.f;
  // acc[r] += the 8 weights of q . row r's elements 8v .. 8v + 7.
  auto dot = [&](const uint4& q, int v) {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    float wf[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      wf[2 * i] = __uint_as_float(u[i] << 16);
      wf[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
#pragma unroll
    for (int r = 0; r < TT; ++r) {
      const float4 a = reinterpret_cast<const float4*>(xn + r * H)[2 * v];
      const float4 b = reinterpret_cast<const float4*>(xn + r * H)[2 * v + 1];
      acc[r] = fmaf(a.x, wf[0], acc[r]);
      acc[r] = fmaf(a.y, wf[1], acc[r]);
      acc[r] = fmaf(a.z, wf[2], acc[r]);
      acc[r] = fmaf(a.w, wf[3], acc[r]);
      acc[r] = fmaf(b.x, wf[4], acc[r]);
      acc[r] = fmaf(b.y, wf[5], acc[r]);
      acc[r] = fmaf(b.z, wf[6], acc[r]);
      acc[r] = fmaf(b.w, wf[7], acc[r]);
    }
  };
  if (vec) {
#pragma unroll
    for (int i = 0; i < kRouterPre; ++i) {
      const int v = lane + 32 * i;
      if (v < nv) dot(pre[i], v);
    }
#pragma unroll 4
    for (int v = lane + 32 * kRouterPre; v < nv; v += 32) dot(__ldg(wv + v), v);
  } else {
    const bf16_t* we = w + static_cast<int64_t>(e) * H;
    for (int i = lane; i < H; i += 32) {
      const float wf = Bf(we[i]);
#pragma unroll
      for (int r = 0; r < TT; ++r) acc[r] = fmaf(xn[r * H + i], wf, acc[r]);
    }
  }
  const float b = bias != nullptr ? bias[e] : 0.f;
#pragma unroll
  for (int r = 0; r < TT; ++r) {
    const float s = WarpSum(acc[r]);
    if (lane == 0 && r < nt) logits[static_cast<int64_t>(t0 + r) * E + e] = s + b;
  }
}

// A warp per token: lane l holds logits l, l + 32, ...; each of the k
// picks is a warp-wide arg-max over (value descending, id ascending) among
// the logits below the previous pick in that order (MoeRouteToken's
// selection, so the same experts, ties to the lower id); lane j keeps pick
// j. The softmax sums over the warp (another summation order than the
// reference's, within float rounding).
constexpr int kRouteWarps = 4;
constexpr int kRoutePerLane = kMaxMoeExperts / 32;
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteKernel(const float* logits, int tokens, int E, int k, bool softmax_first,
                   bool renormalize, int32_t* experts, float* weights) {
  PdlLaunchDependents();
  PdlWait();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (t >= tokens) return;  // (whole warps)
  const float* lg = logits + static_cast<int64_t>(t) * E;
  float v[kRoutePerLane];
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? lg[e] : NAN;  // (NaN: never chosen, never summed)
  }
  float prev_v = INFINITY, my_w = 0.f, mx = 0.f;
  int prev_e = -1, my_e = 0;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bv = -INFINITY;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int e = lane + 32 * i;
      const float val = v[i];
      if (!(val == val)) continue;
      if (!(val < prev_v || (val == prev_v && e > prev_e))) continue;
      if (best < 0 || val > bv) {  // (ids ascend: the lower id wins ties)
        best = e;
        bv = val;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const int ob = __shfl_xor_sync(0xffffffffu, best, o);
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
        best = ob;
        bv = ov;
      }
    }
    int pe;
    float pw;
    if (best < 0) {  // fewer usable logits than k: the rest weigh nothing
      pe = prev_e < 0 ? 0 : prev_e;
      pw = -INFINITY;
    } else {
      pe = best;
      pw = bv;
      prev_v = bv;
      prev_e = best;
    }
    if (j == 0) mx = pw;
    if (lane == j) {
      my_e = pe;
      my_w = pw;
    }
  }
  const bool mine = lane < k;
  float wj;
  if (softmax_first) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i)
      if (v[i] == v[i]) sum += expf(v[i] - mx);
    sum = WarpSum(sum);
    wj = sum > 0.f ? expf(my_w - mx) / sum : 0.f;
    if (renormalize) {
      const float s = WarpSum(mine ? wj : 0.f);
      wj = s > 0.f ? wj / s : 0.f;
    }
  } else {
    const float ex = mine ? expf(my_w - mx) : 0.f;
    const float sum = WarpSum(ex);
    wj = sum > 0.f ? ex / sum : 0.f;
  }
  if (mine) {
    experts[static_cast<int64_t>(t) * k + lane] = my_e;
    weights[static_cast<int64_t>(t) * k + lane] = wj;
  }
}

// One block. Counts by shared-memory atomics (exact), the prefix sums of
// counts and tiles by a block scan (MoePlanOffsets' and MoePlanTiles'
// integers), then
// each warp writes its experts' groups as MoePlanExpert does: assignments
// 32 at a time, a ballot and a population count placing each in token order.
constexpr int kPlanThreads = 1024;
static_assert(kPlanThreads >= kMaxMoeExperts, "a thread per expert in the scan");
__global__ void __launch_bounds__(kPlanThreads)
    MoePlanKernel(const int32_t* experts, int A, int E, int32_t* offsets, int32_t* tiles,
                  int32_t* order, int32_t* slot_of) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ int32_t count[kMaxMoeExperts + 1];
  __shared__ int32_t off[kMaxMoeExperts + 1];
  for (int e = threadIdx.x; e <= E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int a = threadIdx.x; a < A; a += blockDim.x) {
    const int e = experts[a];
    if (e >= 0 && e < E) atomicAdd(&count[e + 1], 1);
  }
  __syncthreads();
  // Prefix sums of the counts and of the tiles per expert (MoePlanOffsets'
  // and MoePlanTiles' integers), thread e for expert e (E <= the block):
  // warp scans, then the warps' totals scanned by one warp.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __shared__ int32_t warp_n[32], warp_t[32];
  const int me = threadIdx.x;
  int n = me < E ? count[me + 1] : 0;
  int t = (n + kMoeTileRows - 1) / kMoeTileRows;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int pn = __shfl_up_sync(0xffffffffu, n, o), pt = __shfl_up_sync(0xffffffffu, t, o);
    if (lane >= o) {
      n += pn;
      t += pt;
    }
  }
  if (lane == 31) {
    warp_n[warp] = n;
    warp_t[warp] = t;
  }
  __syncthreads();
  if (warp == 0) {
    int wn = lane < warps ? warp_n[lane] : 0, wt = lane < warps ? warp_t[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int pn = __shfl_up_sync(0xffffffffu, wn, o), pt = __shfl_up_sync(0xffffffffu, wt, o);
      if (lane >= o) {
        wn += pn;
        wt += pt;
      }
    }
    warp_n[lane] = wn;  // (inclusive: warp w adds entry w - 1)
    warp_t[lane] = wt;
  }
  __syncthreads();
  if (warp > 0) {
    n += warp_n[warp - 1];
    t += warp_t[warp - 1];
  }
  if (me < E) {
    off[me + 1] = n;
    offsets[me + 1] = n;
    tiles[me + 1] = t;
  }
  if (me == 0) {
    off[0] = 0;
    offsets[0] = 0;
    tiles[0] = 0;
  }
  __syncthreads();
  const unsigned below = (1u << lane) - 1u;
  for (int e = warp; e < E; e += warps) {
    int at = off[e];
    for (int a0 = 0; a0 < A; a0 += 32) {
      const int a = a0 + lane;
      const bool mine = a < A && experts[a] == e;
      const unsigned mask = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        const int r = at + __popc(mask & below);
        order[r] = a;
        slot_of[a] = r;
      }
      at += __popc(mask);
    }
  }
}

// Grouped GEMM tiles: a block takes a tile of up to kMoeTileRows rows of
// one group and kCols output columns, K in steps of kK through shared
// memory.
constexpr int kCols = 128;
constexpr int kK = 32;
// The CUDA-core form walks its tile in slices of kSlice rows (a thread a
// column, a register a row).
constexpr int kSlice = 16;
static_assert(kMoeTileRows % kSlice == 0, "tiles are whole slices");

// acc[r] (r < R) = row r of the slice . w[n] over all K (x as floats; w
// transposed, padded against bank conflicts). R: the rows the slice is
// known to fit in (a decode step's slice of one to four rows then does a
// quarter of the arithmetic of a full one for the same weight traffic).
template <int R>
__device__ __forceinline__ void Accumulate(const MoeGemmParams& p, const bf16_t* w, int row0,
                                           int rows, int n0, float (&acc)[kSlice], float (*xs)[kK],
                                           float (*ws)[kK + 1]) {
  const int tid = threadIdx.x;
  for (int k0 = 0; k0 < p.K; k0 += kK) {
#pragma unroll
    for (int i = 0; i < R * kK / kCols + (R * kK % kCols != 0); ++i) {
      const int idx = tid + i * kCols, r = idx / kK, kk = idx % kK;
      if (r >= R) break;
      float v = 0.f;
      if (r < rows && k0 + kk < p.K) {
        const int g = row0 + r;
        const int64_t src = p.order != nullptr ? p.order[g] / p.div : g;
        v = Bf(p.x[src * p.K + k0 + kk]);
      }
      xs[r][kk] = v;
    }
#pragma unroll 4
    for (int i = 0; i < kK; ++i) {  // kCols * kK elements, kCols threads
      const int idx = tid + i * kCols, c = idx / kK, kk = idx % kK;
      const int nn = n0 + c;
      ws[c][kk] = nn < p.N && k0 + kk < p.K ? Bf(w[static_cast<int64_t>(nn) * p.K + k0 + kk]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kK; ++kk) {
      const float wv = ws[tid][kk];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(xs[r][kk], wv, acc[r]);
    }
    __syncthreads();
  }
}

// The group, first row and row count of this block's tile (blockIdx.y);
// false past the last tile.
__device__ __forceinline__ bool TileOf(const MoeGemmParams& p, int& e, int& row0, int& rows) {
  e = 0;
  row0 = 0;
  int row_end = p.rows;
  if (p.offsets != nullptr) {
    e = MoeTileExpert(blockIdx.y, p.tiles, p.offsets, p.num_experts, &row0);
    if (e < 0) return false;
    row_end = p.offsets[e + 1];
  } else {
    row0 = blockIdx.y * kMoeTileRows;
    if (row0 >= row_end) return false;
  }
  rows = min(kMoeTileRows, row_end - row0);
  return true;
}

// Column n of `rows` rows from row0 (acc(r): row r's sum): bias, then
// stored (fp32) or through the gated activation (bf16). Every thread of the
// block calls it with the same rows (the gated form shuffles between lane
// pairs).
template <typename AccFn>
__device__ __forceinline__ void Epilogue(const MoeGemmParams& p, int e, int row0, int rows, int n,
                                         AccFn acc) {
  const float b = p.bias != nullptr && n < p.N ? p.bias[static_cast<int64_t>(e) * p.N + n] : 0.f;
  if (p.epilogue == MoeEpilogue::kStore) {
    if (n >= p.N) return;
    for (int r = 0; r < rows; ++r) {
      float* y = p.y + static_cast<int64_t>(row0 + r) * p.N + n;
      *y = (p.accumulate ? *y : 0.f) + acc(r) + b;
    }
    return;
  }
  if (p.epilogue == MoeEpilogue::kStoreBf16) {
    if (n >= p.N) return;
    for (int r = 0; r < rows; ++r)
      p.act[static_cast<int64_t>(row0 + r) * p.N + n] = ToBf(acc(r) + b);
    return;
  }
  // Gated: column 2j is gate j, 2j + 1 up j; the pair sits in lanes 2i and
  // 2i + 1 of a warp (n0 and kCols are even). Every lane shuffles.
  const int half = p.N / 2;
  for (int r = 0; r < rows; ++r) {
    const float v = acc(r) + b;
    const float up = __shfl_xor_sync(0xffffffffu, v, 1);
    if ((threadIdx.x & 1) != 0 || n >= p.N) continue;
    const float out = GatedProduct(v, up, MoeEpilogueForm(p.epilogue), p.limit);
    p.act[static_cast<int64_t>(row0 + r) * half + n / 2] = ToBf(out);
  }
}

__global__ void __launch_bounds__(kCols) MoeGemmKernel(const MoeGemmParams p) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ float xs[kSlice][kK];
  __shared__ float ws[kCols][kK + 1];
  int e, row0, rows;
  if (!TileOf(p, e, row0, rows)) return;
  const int n0 = blockIdx.x * kCols;
  const bf16_t* w = p.w + static_cast<int64_t>(e) * p.N * p.K;
  // (rows, and so each slice's size, is the same for the whole block: the
  // branches synchronise alike.)
  for (int s0 = 0; s0 < rows; s0 += kSlice) {
    const int n = min(kSlice, rows - s0);
    float acc[kSlice];
#pragma unroll
    for (int r = 0; r < kSlice; ++r) acc[r] = 0.f;
    if (n <= 4) {
      Accumulate<4>(p, w, row0 + s0, n, n0, acc, xs, ws);
    } else {
      Accumulate<kSlice>(p, w, row0 + s0, n, n0, acc, xs, ws);
    }
    Epilogue(p, e, row0 + s0, n, n0 + threadIdx.x, [&](int r) {
      float v = 0.f;
#pragma unroll
      for (int i = 0; i < kSlice; ++i) v = i == r ? acc[i] : v;  // (registers, no local memory)
      return v;
    });
  }
}

// Quantized weights staged for the tensor cores, in two halves so that the
// loads of the next K step are in flight during this one's MMAs: QuantLoad
// reads the 8 values of row n from column k (k a multiple of 8; K a
// multiple of the format's 16-byte load, so the 8 are whole) raw, with
// their scale (0 past N or K); QuantStore writes them as bf16. mxfp4
// values are exact in bf16 (two mantissa bits times a power of two); fp8
// values times their block scale are rounded to bf16 (a relative 2^-9 at
// most, as the activations they meet already are).
template <MoeWeightFormat F>
__device__ __forceinline__ void QuantLoad(const MoeGemmParams& p, int e, int n, int k, uint2& raw,
                                          float& scale) {
  raw = make_uint2(0u, 0u);
  scale = 0.f;
  if (n >= p.N || k >= p.K) return;
  const int64_t row = static_cast<int64_t>(e) * p.N + n;
  if constexpr (F == MoeWeightFormat::kFp8Block) {
    raw = __ldg(reinterpret_cast<const uint2*>(p.wq + row * p.K + k));
    scale = moeq::Fp8Scale(p, e, n, k);
  } else {
    raw.x = __ldg(reinterpret_cast<const uint32_t*>(p.wq + (row * p.K + k) / 2));
    scale = moeq::E8m0(__ldg(p.exps + row * (p.K / 32) + k / 32));
  }
}

template <MoeWeightFormat F>
__device__ __forceinline__ void QuantStore(const uint2& raw, float scale, bf16* dst) {
  float f[8];
  if constexpr (F == MoeWeightFormat::kFp8Block) {
    moeq::E4m3x4(raw.x, f);
    moeq::E4m3x4(raw.y, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] *= scale;
  } else {
    float g[8];
    moeq::Fp4x8(raw.x, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = g[i] * 16384.f * scale;
  }
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b2 = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    packed[i] = *reinterpret_cast<const uint32_t*>(&b2);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// The same tiles on the tensor cores (WMMA bf16 -> fp32, 16 x 16 x 16):
// warp w takes rows 16w .. 16w + 15 of the tile against all kCols columns
// (kCols / 16 accumulators), sharing the block's weight stage; warps whose
// rows are all past the tile skip the arithmetic. K in steps of kK through
// two shared-memory stages (rows padded to kLd elements: 16-byte aligned,
// off the bank pattern): each thread loads its chunks of the next step
// into registers before this step's MMAs and stores them into the other
// stage after, so one barrier a step and the loads' latency under the
// MMAs. The product goes through shared memory (the stages' space) to the
// epilogue. Quantized weights (F) are dequantized to bf16 as they are
// staged (QuantLoad, QuantStore). The next steps for speed: wider tiles,
// TMA, the warpgroup MMA.
constexpr int kLd = kK + 8;
constexpr int kCld = kCols + 4;
constexpr int kWmmaWarps = kCols / 32;
static_assert(kMoeTileRows == 16 * kWmmaWarps, "a warp a 16-row slice of the tile");
constexpr size_t kXsBytes = kMoeTileRows * kLd * 2, kWsBytes = kCols * kLd * 2;
constexpr size_t kStageBytes = kXsBytes + kWsBytes;
constexpr size_t kCsBytes = kMoeTileRows * kCld * 4;
constexpr size_t kWmmaSmem = 2 * kStageBytes > kCsBytes ? 2 * kStageBytes : kCsBytes;
constexpr int kXChunks = kMoeTileRows * (kK / 8) / kCols;  // a thread's 8-element chunks of x
constexpr int kWChunks = kCols * (kK / 8) / kCols;         // and of w, per K step
static_assert(kXChunks * kCols == kMoeTileRows * (kK / 8) && kWChunks * kCols == kCols * (kK / 8),
              "whole chunks per thread");

template <MoeWeightFormat F>
__global__ void __launch_bounds__(kCols) MoeGemmWmmaKernel(const MoeGemmParams p) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ __align__(128) unsigned char smem[kWmmaSmem];
  float* cs = reinterpret_cast<float*>(smem);  // after the last step
  int e, row0, rows;
  if (!TileOf(p, e, row0, rows)) return;
  const int n0 = blockIdx.x * kCols, tid = threadIdx.x, warp = tid >> 5;
  const bf16_t* w =
      F == MoeWeightFormat::kBf16 ? p.w + static_cast<int64_t>(e) * p.N * p.K : nullptr;
  const bool vec = p.K % 8 == 0;  // 16-byte loads of whole 8-element chunks
  const bool busy = warp * 16 < rows;
  constexpr int kFrags = kCols / 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFrags];
#pragma unroll
  for (int f = 0; f < kFrags; ++f) wmma::fill_fragment(acc[f], 0.f);
  // The source row of each of the thread's x chunks (-1: past the tile).
  int64_t xrow[kXChunks];
#pragma unroll
  for (int j = 0; j < kXChunks; ++j) {
    const int r = (tid + j * kCols) / (kK / 8);
    const int g = row0 + r;
    xrow[j] = r < rows ? (p.order != nullptr ? p.order[g] / p.div : g) : -1;
  }
  // 8 bf16 values from src (k its column; zeros past K), as 16 bytes.
  auto chunk = [&](const bf16_t* src, int k) {
    if (vec && k + 8 <= p.K) return *reinterpret_cast<const uint4*>(src);
    uint32_t v[4] = {0u, 0u, 0u, 0u};
    for (int i = 0; i < 8; ++i)
      if (k + i < p.K) v[i / 2] |= static_cast<uint32_t>(src[i]) << (16 * (i % 2));
    return make_uint4(v[0], v[1], v[2], v[3]);
  };
  uint4 xr[kXChunks], wr[kWChunks];  // the next step's chunks
  uint2 qr[kWChunks];                // (quantized: raw bytes and scales)
  float qs[kWChunks];
  auto load = [&](int k0) {
#pragma unroll
    for (int j = 0; j < kXChunks; ++j) {
      const int k = k0 + ((tid + j * kCols) % (kK / 8)) * 8;
      xr[j] =
          xrow[j] >= 0 && k < p.K ? chunk(p.x + xrow[j] * p.K + k, k) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < kWChunks; ++j) {
      const int idx = tid + j * kCols, nn = n0 + idx / (kK / 8), k = k0 + (idx % (kK / 8)) * 8;
      if constexpr (F == MoeWeightFormat::kBf16) {
        wr[j] = nn < p.N && k < p.K ? chunk(w + static_cast<int64_t>(nn) * p.K + k, k)
                                    : make_uint4(0u, 0u, 0u, 0u);
      } else {
        QuantLoad<F>(p, e, nn, k, qr[j], qs[j]);
      }
    }
  };
  auto store = [&](int stage) {
    bf16* xs = reinterpret_cast<bf16*>(smem + stage * kStageBytes);
    bf16* ws = reinterpret_cast<bf16*>(smem + stage * kStageBytes + kXsBytes);
#pragma unroll
    for (int j = 0; j < kXChunks; ++j) {
      const int idx = tid + j * kCols;
      *reinterpret_cast<uint4*>(xs + (idx / (kK / 8)) * kLd + (idx % (kK / 8)) * 8) = xr[j];
    }
#pragma unroll
    for (int j = 0; j < kWChunks; ++j) {
      const int idx = tid + j * kCols;
      bf16* dst = ws + (idx / (kK / 8)) * kLd + (idx % (kK / 8)) * 8;
      if constexpr (F == MoeWeightFormat::kBf16) {
        *reinterpret_cast<uint4*>(dst) = wr[j];
      } else {
        QuantStore<F>(qr[j], qs[j], dst);
      }
    }
  };
  load(0);
  store(0);
  __syncthreads();
  int stage = 0;
  for (int k0 = 0; k0 < p.K; k0 += kK) {
    const bool next = k0 + kK < p.K;
    if (next) load(k0 + kK);
    if (busy) {
      const bf16* xs = reinterpret_cast<const bf16*>(smem + stage * kStageBytes);
      const bf16* ws = reinterpret_cast<const bf16*>(smem + stage * kStageBytes + kXsBytes);
#pragma unroll
      for (int kk = 0; kk < kK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, xs + warp * 16 * kLd + kk, kLd);
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          // B (k x n) at ws[n][k]: column-major with leading dimension kLd.
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
          wmma::load_matrix_sync(b, ws + f * 16 * kLd + kk, kLd);
          wmma::mma_sync(acc[f], a, b, acc[f]);
        }
      }
    }
    // The other stage was last read by the previous step's MMAs, which
    // every warp finished before the previous barrier.
    if (next) store(stage ^ 1);
    __syncthreads();
    stage ^= 1;
  }
  // (The stages are free: every warp passed the loop's last barrier.)
  if (busy) {
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
      wmma::store_matrix_sync(cs + warp * 16 * kCld + f * 16, acc[f], kCld, wmma::mem_row_major);
  }
  __syncthreads();
  Epilogue(p, e, row0, rows, n0 + tid, [&](int r) { return cs[r * kCld + tid]; });
}

// A block per token and 256 columns.
__global__ void MoeCombineKernel(const float* y, const int32_t* slot_of, const float* weights,
                                 int k, int H, float* x) {
  PdlLaunchDependents();
  PdlWait();
  const int t = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float s = 0.f;
  for (int j = 0; j < k; ++j) {
    const int64_t a = static_cast<int64_t>(t) * k + j;
    s += weights[a] * y[static_cast<int64_t>(slot_of[a]) * H + h];
  }
  x[static_cast<int64_t>(t) * H + h] += s;
}

}  // namespace

namespace {

// Tokens per router block: as many as fit 96 KiB of fp32 rows (at most 8),
// and no more than the step has.
int RouterTokensPerBlock(int tokens, int H) {
  int tt = 1;
  while (tt < 8 && tt < tokens && static_cast<size_t>(2 * tt) * H * sizeof(float) <= 96 * 1024)
    tt *= 2;
  return tt;
}

template <int TT>
cudaError_t LaunchRouter(const float* x, const float* norm_w, float eps, bool plus_one,
                         const bf16_t* w, const float* bias, int tokens, int H, int E,
                         float* logits, LaunchConfig launch) {
  const size_t smem = static_cast<size_t>(TT) * H * sizeof(float);
  if (smem > 48 * 1024) {  // (shared memory past 48 KiB must be asked for, per device)
    const cudaError_t e = cudaFuncSetAttribute(
        MoeRouterKernel<TT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid((tokens + TT - 1) / TT, (E + kRouterWarps - 1) / kRouterWarps);
  return LaunchPdl(MoeRouterKernel<TT>, grid, dim3(kRouterWarps * 32), smem, launch, x, norm_w, eps,
                   plus_one, w, bias, tokens, H, E, logits);
}

}  // namespace

cudaError_t LaunchMoeRouterLogits(const float* x, const float* norm_w, float eps, bool plus_one,
                                  const bf16_t* w, const float* bias, int tokens, int H, int E,
                                  float* logits, LaunchConfig launch) {
  if (H <= 0 || H > kMaxMoeRouterHidden || E <= 0) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  if (E > 65535 * kRouterWarps) return cudaErrorInvalidValue;  // (the grid's y extent)
  switch (RouterTokensPerBlock(tokens, H)) {
    case 8:
      return LaunchRouter<8>(x, norm_w, eps, plus_one, w, bias, tokens, H, E, logits, launch);
    case 4:
      return LaunchRouter<4>(x, norm_w, eps, plus_one, w, bias, tokens, H, E, logits, launch);
    case 2:
      return LaunchRouter<2>(x, norm_w, eps, plus_one, w, bias, tokens, H, E, logits, launch);
    default:
      return LaunchRouter<1>(x, norm_w, eps, plus_one, w, bias, tokens, H, E, logits, launch);
  }
}

cudaError_t LaunchMoeRoute(const float* logits, int tokens, int num_experts, int k,
                           bool softmax_first, bool renormalize, int32_t* experts, float* weights,
                           LaunchConfig launch) {
  if (num_experts <= 0 || num_experts > kMaxMoeExperts || k <= 0 || k > num_experts ||
      k > kMaxMoeTopK)
    return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  return LaunchPdl(MoeRouteKernel, dim3((tokens + kRouteWarps - 1) / kRouteWarps),
                   dim3(kRouteWarps * 32), 0, launch, logits, tokens, num_experts, k, softmax_first,
                   renormalize, experts, weights);
}

cudaError_t LaunchMoePlan(const int32_t* experts, int assignments, int num_experts,
                          int32_t* offsets, int32_t* tiles, int32_t* order, int32_t* slot_of,
                          LaunchConfig launch) {
  if (num_experts <= 0 || num_experts > kMaxMoeExperts || assignments < 0)
    return cudaErrorInvalidValue;
  return LaunchPdl(MoePlanKernel, dim3(1), dim3(kPlanThreads), 0, launch, experts, assignments,
                   num_experts, offsets, tiles, order, slot_of);
}

cudaError_t LaunchMoeGemm(const MoeGemmParams& p, LaunchConfig launch) {
  if (p.path == MoeGemmPath::kGemv) return LaunchMoeGemv(p, launch);
  if (p.path == MoeGemmPath::kUnsupported) return cudaErrorInvalidValue;
  // The CUDA-core tiles read bf16 only; the tensor cores' quantized weights
  // in whole 16-byte loads per row, with their scales.
  const bool quantized = p.format != MoeWeightFormat::kBf16;
  if (quantized && (p.path != MoeGemmPath::kTensorCores || p.wq == nullptr ||
                    p.K % MoeWeightVecElems(p.format) != 0 ||
                    (p.format == MoeWeightFormat::kFp8Block &&
                     (p.scales == nullptr || p.block_rows <= 0 || p.block_cols <= 0 ||
                      p.block_cols % 16 != 0 || (p.scale_pairs && p.N % 2 != 0))) ||
                    (p.format == MoeWeightFormat::kMxfp4 && p.exps == nullptr)))
    return cudaErrorInvalidValue;
  if (p.N <= 0 || p.K <= 0 || p.num_experts <= 0 || p.div <= 0) return cudaErrorInvalidValue;
  if (!MoeEpilogueOutputsOk(p)) return cudaErrorInvalidValue;
  if (p.offsets != nullptr && (p.tiles == nullptr || p.num_experts > kMaxMoeExperts))
    return cudaErrorInvalidValue;
  const int tiles = p.offsets != nullptr ? p.max_tiles : (p.rows + kMoeTileRows - 1) / kMoeTileRows;
  if (tiles <= 0) return cudaSuccess;
  if (tiles > 65535) return cudaErrorInvalidValue;  // (the grid's y extent)
  auto kernel = MoeGemmKernel;
  if (p.path == MoeGemmPath::kTensorCores)
    kernel = p.format == MoeWeightFormat::kFp8Block ? MoeGemmWmmaKernel<MoeWeightFormat::kFp8Block>
             : p.format == MoeWeightFormat::kMxfp4  ? MoeGemmWmmaKernel<MoeWeightFormat::kMxfp4>
                                                    : MoeGemmWmmaKernel<MoeWeightFormat::kBf16>;
  return LaunchPdl(kernel, dim3((p.N + kCols - 1) / kCols, tiles), dim3(kCols), 0, launch, p);
}

cudaError_t LaunchMoeCombine(const float* y, const int32_t* slot_of, const float* weights,
                             int tokens, int k, int H, float* x, LaunchConfig launch) {
  if (k <= 0 || H <= 0) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  return LaunchPdl(MoeCombineKernel, dim3(tokens, (H + 255) / 256), dim3(256), 0, launch, y,
                   slot_of, weights, k, H, x);
}

}  // namespace agentkv::backend::cuda::kernels
