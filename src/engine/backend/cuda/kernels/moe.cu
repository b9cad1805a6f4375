// Mixture-of-experts kernels (moe.h).
#include <cuda_bf16.h>
#include <mma.h>

#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/kernels/moe_plan.h"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"

namespace agentkv::cuda {
namespace {

using namespace reduce;
using namespace nvcuda;
using bf16 = __nv_bfloat16;

// A block per token: its normalised row in shared memory (fp32), then a
// warp per expert.
constexpr int kRouterThreads = 256;
__global__ void __launch_bounds__(kRouterThreads)
    MoeRouterKernel(const float* x, const float* norm_w, float eps, bool plus_one, const bf16_t* w,
                    const float* bias, int H, int E, float* logits) {
  PdlLaunchDependents();
  PdlWait();
  extern __shared__ float xn[];
  __shared__ float red[32];
  const int t = blockIdx.x;
  const float* xr = x + static_cast<int64_t>(t) * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float v = xr[i];
    xn[i] = v;
    ss += v * v;
  }
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    xn[i] = xn[i] * inv * (plus_one ? 1.f + norm_w[i] : norm_w[i]);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int e = warp; e < E; e += warps) {
    const bf16_t* we = w + static_cast<int64_t>(e) * H;
    float dot = 0.f;
    for (int i = lane; i < H; i += 32) dot = fmaf(xn[i], Bf(we[i]), dot);
    dot = WarpSum(dot);
    if (lane == 0) logits[static_cast<int64_t>(t) * E + e] = dot + (bias ? bias[e] : 0.f);
  }
}

// A thread per token: E * k comparisons, a few thousand at most.
__global__ void MoeRouteKernel(const float* logits, int tokens, int E, int k, bool softmax_first,
                               bool renormalize, int32_t* experts, float* weights) {
  PdlLaunchDependents();
  PdlWait();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  MoeRouteToken(logits + static_cast<int64_t>(t) * E, E, k, softmax_first, renormalize,
                experts + static_cast<int64_t>(t) * k, weights + static_cast<int64_t>(t) * k);
}

// One block. Counts by shared-memory atomics (exact), the prefix sums and
// tiles by one thread (MoePlanOffsets' and MoePlanTiles' arithmetic), then
// each warp writes its experts' groups as MoePlanExpert does: assignments
// 32 at a time, a ballot and a population count placing each in token order.
constexpr int kPlanThreads = 1024;
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
  if (threadIdx.x == 0) {
    off[0] = 0;
    for (int e = 0; e < E; ++e) off[e + 1] = off[e] + count[e + 1];
    for (int e = 0; e <= E; ++e) offsets[e] = off[e];
    MoePlanTiles(off, E, tiles);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
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
    for (int r = 0; r < rows; ++r) p.y[static_cast<int64_t>(row0 + r) * p.N + n] = acc(r) + b;
    return;
  }
  // Gated: column 2j is gate j, 2j + 1 up j; the pair sits in lanes 2i and
  // 2i + 1 of a warp (n0 and kCols are even). Every lane shuffles.
  const int half = p.N / 2;
  for (int r = 0; r < rows; ++r) {
    const float v = acc(r) + b;
    const float up = __shfl_xor_sync(0xffffffffu, v, 1);
    if ((threadIdx.x & 1) != 0 || n >= p.N) continue;
    float gate = v, u = up, out;
    if (p.epilogue == MoeEpilogue::kClampedSwiglu) {
      gate = fminf(gate, p.limit);
      u = fminf(fmaxf(u, -p.limit), p.limit);
      out = (u + 1.f) * gate / (1.f + expf(-1.702f * gate));
    } else {
      out = gate / (1.f + expf(-gate)) * u;
    }
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

// The same tiles on the tensor cores (WMMA bf16 -> fp32, 16 x 16 x 16):
// warp w takes rows 16w .. 16w + 15 of the tile against all kCols columns
// (kCols / 16 accumulators), sharing the block's weight stage; warps whose
// rows are all past the tile skip the arithmetic. K in steps of kK through
// shared memory (rows padded to kLd elements: 16-byte aligned, off the bank
// pattern); the product goes through shared memory (the stages' space) to
// the epilogue. No pipelining yet: the next step for speed (cp.async or
// TMA stages, the warpgroup MMA).
constexpr int kLd = kK + 8;
constexpr int kCld = kCols + 4;
constexpr int kWmmaWarps = kCols / 32;
static_assert(kMoeTileRows == 16 * kWmmaWarps, "a warp a 16-row slice of the tile");
constexpr size_t kXsBytes = kMoeTileRows * kLd * 2, kWsBytes = kCols * kLd * 2;
constexpr size_t kCsBytes = kMoeTileRows * kCld * 4;
constexpr size_t kWmmaSmem = kXsBytes + kWsBytes > kCsBytes ? kXsBytes + kWsBytes : kCsBytes;
__global__ void __launch_bounds__(kCols) MoeGemmWmmaKernel(const MoeGemmParams p) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ __align__(128) unsigned char smem[kWmmaSmem];
  bf16* xs = reinterpret_cast<bf16*>(smem);
  bf16* ws = reinterpret_cast<bf16*>(smem + kXsBytes);
  float* cs = reinterpret_cast<float*>(smem);  // after the last stage
  int e, row0, rows;
  if (!TileOf(p, e, row0, rows)) return;
  const int n0 = blockIdx.x * kCols, tid = threadIdx.x, warp = tid >> 5;
  const bf16* w = reinterpret_cast<const bf16*>(p.w) + static_cast<int64_t>(e) * p.N * p.K;
  const bf16* x = reinterpret_cast<const bf16*>(p.x);
  const bool vec = p.K % 8 == 0;  // 16-byte loads of whole 8-element chunks
  const bool busy = warp * 16 < rows;
  const bf16 zero = __float2bfloat16(0.f);
  constexpr int kFrags = kCols / 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFrags];
#pragma unroll
  for (int f = 0; f < kFrags; ++f) wmma::fill_fragment(acc[f], 0.f);
  // 8-element chunk q of row r at dst from src (null: zeros), k its column.
  auto chunk = [&](bf16* dst, const bf16* src, int k) {
    if (src != nullptr && vec && k + 8 <= p.K) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int i = 0; i < 8; ++i) dst[i] = src != nullptr && k + i < p.K ? src[i] : zero;
    }
  };
  for (int k0 = 0; k0 < p.K; k0 += kK) {
    // x: kMoeTileRows rows x kK / 8 chunks; w: kCols rows x kK / 8 chunks.
#pragma unroll
    for (int j = 0; j < kMoeTileRows * (kK / 8) / kCols; ++j) {
      const int idx = tid + j * kCols, r = idx / (kK / 8), q = idx % (kK / 8), k = k0 + q * 8;
      const bf16* src = nullptr;
      if (r < rows) {
        const int g = row0 + r;
        const int64_t row = p.order != nullptr ? p.order[g] / p.div : g;
        src = x + row * p.K + k;
      }
      chunk(xs + r * kLd + q * 8, src, k);
    }
#pragma unroll
    for (int j = 0; j < kCols * (kK / 8) / kCols; ++j) {
      const int idx = tid + j * kCols, c = idx / (kK / 8), q = idx % (kK / 8), k = k0 + q * 8;
      const int nn = n0 + c;
      chunk(ws + c * kLd + q * 8, nn < p.N ? w + static_cast<int64_t>(nn) * p.K + k : nullptr, k);
    }
    __syncthreads();
    if (busy) {
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
    __syncthreads();
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

cudaError_t LaunchMoeRouterLogits(const float* x, const float* norm_w, float eps, bool plus_one,
                                  const bf16_t* w, const float* bias, int tokens, int H, int E,
                                  float* logits, LaunchConfig launch) {
  if (H <= 0 || H > kMaxMoeRouterHidden || E <= 0) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(H) * sizeof(float);
  // (Shared memory past 48 KB must be asked for once per device.)
  static PerDeviceOnce raised;
  if (smem > 48 * 1024) {
    const cudaError_t e = raised.Run([] {
      return cudaFuncSetAttribute(MoeRouterKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kMaxMoeRouterHidden * sizeof(float)));
    });
    if (e != cudaSuccess) return e;
  }
  return LaunchPdl(MoeRouterKernel, dim3(tokens), dim3(kRouterThreads), smem, launch, x, norm_w,
                   eps, plus_one, w, bias, H, E, logits);
}

cudaError_t LaunchMoeRoute(const float* logits, int tokens, int num_experts, int k,
                           bool softmax_first, bool renormalize, int32_t* experts, float* weights,
                           LaunchConfig launch) {
  if (num_experts <= 0 || num_experts > kMaxMoeExperts || k <= 0 || k > num_experts ||
      k > kMaxMoeTopK)
    return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  return LaunchPdl(MoeRouteKernel, dim3((tokens + 127) / 128), dim3(128), 0, launch, logits, tokens,
                   num_experts, k, softmax_first, renormalize, experts, weights);
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
  if (p.N <= 0 || p.K <= 0 || p.num_experts <= 0 || p.div <= 0) return cudaErrorInvalidValue;
  const bool gated = p.epilogue != MoeEpilogue::kStore;
  if (gated ? (p.act == nullptr || p.N % 2 != 0) : p.y == nullptr) return cudaErrorInvalidValue;
  if (p.offsets != nullptr && (p.tiles == nullptr || p.num_experts > kMaxMoeExperts))
    return cudaErrorInvalidValue;
  const int tiles = p.offsets != nullptr ? p.max_tiles : (p.rows + kMoeTileRows - 1) / kMoeTileRows;
  if (tiles <= 0) return cudaSuccess;
  if (tiles > 65535) return cudaErrorInvalidValue;  // (the grid's y extent)
  return LaunchPdl(p.tensor_cores ? MoeGemmWmmaKernel : MoeGemmKernel,
                   dim3((p.N + kCols - 1) / kCols, tiles), dim3(kCols), 0, launch, p);
}

cudaError_t LaunchMoeCombine(const float* y, const int32_t* slot_of, const float* weights,
                             int tokens, int k, int H, float* x, LaunchConfig launch) {
  if (k <= 0 || H <= 0) return cudaErrorInvalidValue;
  if (tokens <= 0) return cudaSuccess;
  return LaunchPdl(MoeCombineKernel, dim3(tokens, (H + 255) / 256), dim3(256), 0, launch, y,
                   slot_of, weights, k, H, x);
}

}  // namespace agentkv::cuda
