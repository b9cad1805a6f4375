// The grouped GEMM's weight-streaming form (moe.h, LaunchMoeGemv): for
// decode steps, whose groups hold a few rows each, the cost is reading each
// selected expert's weights once, so the kernel is built as the dense
// decode GEMV (gemv.cu) is: 16-byte loads, several in flight per lane, many
// blocks per expert over N, warp-level dot products.
//
// This file holds the bf16 form and the launcher; fp8 block and mxfp4
// weights go to the tensor-core form (moe_gemv_mma.cu), whose conversions
// cost a fraction of the CUDA cores' (the CUDA-core quantized form that was
// here: dev/cuda/README.md).
//
// A block takes one row tile of one group (as the tiled kernels do) and
// kGemvWarps * kPairRows weight rows; each warp a pair of consecutive rows
// (for the gated epilogues, a gate row and its up row), lanes over K. The
// tile's rows pass through shared memory R at a time (x gathered as bf16),
// each pass streaming the warp's weight rows once: a decode step is one
// pass. Lanes read x at a stride of one load's elements.
#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/kernels/moe_gemv_mma.h"
#include "engine/backend/cuda/kernels/moe_plan.h"
#include "engine/backend/cuda/kernels/moe_quant.cuh"
#include "engine/backend/cuda/kernels/moe_tile.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;
using namespace agentkv::backend::cuda::kernels::moeq;

constexpr int kGemvWarps = 8;
constexpr int kPairRows = 2;  // weight rows per warp
constexpr int kLoads = 4;     // 16-byte loads per lane per weight row per round
constexpr int kRowsPerBlock = kGemvWarps * kPairRows;
constexpr int kRound = 32 * kLoads;  // loads of a weight row per warp round

using Tile = MoeTile;

// The weight loads of one round for the warp's rows: load j = round *
// kRound + u * 32 + lane of each row (zeros past the row or past N).
__device__ __forceinline__ void LoadRound(const MoeGemmParams& p, const Tile& t, int n0, int kv,
                                          int round, int lane, uint4 (&wv)[kPairRows][kLoads]) {
#pragma unroll
  for (int q = 0; q < kPairRows; ++q) {
    const int n = n0 + q;
    const int64_t row = static_cast<int64_t>(t.e) * p.N + n;
    const uint4* base = reinterpret_cast<const uint4*>(p.w) + row * kv;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int j = round * kRound + u * 32 + lane;
      wv[q][u] = n < p.N && j < kv ? __ldg(base + j) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// acc[q][r] += weight row q's load (vector j) . row r of xs, for the R
// rows of the pass.
template <int R>
__device__ __forceinline__ void DotLoad(const uint4 (&wv)[kPairRows], const bf16_t* xs, int K,
                                        int j, float (&acc)[kPairRows][R]) {
  float wf[kPairRows][8];
#pragma unroll
  for (int q = 0; q < kPairRows; ++q) Bf16x8(wv[q], wf[q]);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float xf[8];
    Bf16x8(reinterpret_cast<const uint4*>(xs + static_cast<int64_t>(r) * K)[j], xf);
#pragma unroll
    for (int q = 0; q < kPairRows; ++q)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[q][r] = fmaf(wf[q][c], xf[c], acc[q][r]);
  }
}

// Rows [c0, c0 + R) of the tile into xs (bf16 [R][K]; zeros past the
// tile's rows).
template <int R>
__device__ __forceinline__ void StageRows(const MoeGemmParams& p, const Tile& t, int c0,
                                          bf16_t* xs) {
  const int kv8 = p.K / 8;
  for (int i = threadIdx.x; i < R * kv8; i += blockDim.x) {
    const int r = i / kv8, q = i % kv8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (c0 + r < t.rows) {
      const int g = t.row0 + c0 + r;
      const int64_t src = p.order != nullptr ? p.order[g] / p.div : g;
      v = reinterpret_cast<const uint4*>(p.x + src * p.K)[q];
    }
    reinterpret_cast<uint4*>(xs)[i] = v;
  }
}

template <int R>
__global__ void __launch_bounds__(kGemvWarps * 32) MoeGemvKernel(const MoeGemmParams p) {
  PdlLaunchDependents();
  PdlWait();
  extern __shared__ __align__(16) unsigned char smem[];
  const int E = p.offsets != nullptr ? p.num_experts : 0;
  int32_t* tiles_s = reinterpret_cast<int32_t*>(smem);
  int32_t* offsets_s = tiles_s + (E + 1);
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + (2 * (E + 1) * 4 + 15) / 16 * 16);
  // The tile: the grouping in shared memory (one round of loads), then the
  // search there, as MoeTileExpert does.
  Tile t;
  if (!FindMoeTile(p, E, blockIdx.y, tiles_s, offsets_s, &t)) return;  // (the whole block)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * kRowsPerBlock + warp * kPairRows;
  const int kv = p.K / 8;
  const int rounds = (kv + kRound - 1) / kRound;
  uint4 wv[kPairRows][kLoads];
  // The first round's weights go out before x is gathered.
  LoadRound(p, t, n0, kv, 0, lane, wv);
  StageRows<R>(p, t, 0, xs);
  __syncthreads();
  const bool gated = MoeEpilogueGated(p.epilogue);
  float bias[kPairRows];
#pragma unroll
  for (int q = 0; q < kPairRows; ++q)
    bias[q] =
        p.bias != nullptr && n0 + q < p.N ? p.bias[static_cast<int64_t>(t.e) * p.N + n0 + q] : 0.f;
  for (int c0 = 0; c0 < t.rows; c0 += R) {
    if (c0 > 0) {
      __syncthreads();  // every warp is done with the last pass's rows
      StageRows<R>(p, t, c0, xs);
      __syncthreads();
    }
    float acc[kPairRows][R];
#pragma unroll
    for (int q = 0; q < kPairRows; ++q)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[q][r] = 0.f;
    for (int round = 0; round < rounds; ++round) {
      if (c0 > 0 || round > 0) LoadRound(p, t, n0, kv, round, lane, wv);
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int j = round * kRound + u * 32 + lane;
        if (j >= kv) break;  // (j grows with u)
        const uint4 w2[kPairRows] = {wv[0][u], wv[1][u]};
        DotLoad<R>(w2, xs, p.K, j, acc);
      }
    }
    // Every lane gets the sums; lane r stores row c0 + r.
#pragma unroll
    for (int q = 0; q < kPairRows; ++q)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[q][r] = WarpSum(acc[q][r]);
    if (n0 >= p.N) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (lane != r || c0 + r >= t.rows) continue;
      const int64_t g = t.row0 + c0 + r;
      if (p.epilogue == MoeEpilogue::kStoreBf16) {
#pragma unroll
        for (int q = 0; q < kPairRows; ++q)
          if (n0 + q < p.N) p.act[g * p.N + n0 + q] = ToBf(acc[q][r] + bias[q]);
        continue;
      }
      if (!gated) {
#pragma unroll
        for (int q = 0; q < kPairRows; ++q)
          if (n0 + q < p.N) {
            float* y = p.y + g * p.N + n0 + q;
            *y = (p.accumulate ? *y : 0.f) + acc[q][r] + bias[q];
          }
        continue;
      }
      // (N is even and n0 too: the pair is whole.) As moe.cu's Epilogue.
      const float out = GatedProduct(acc[0][r] + bias[0], acc[1][r] + bias[1],
                                     MoeEpilogueForm(p.epilogue), p.limit);
      p.act[g * (p.N / 2) + n0 / 2] = ToBf(out);
    }
  }
}

template <int R>
cudaError_t LaunchFor(const MoeGemmParams& p, int tiles, LaunchConfig launch) {
  const int E = p.offsets != nullptr ? p.num_experts : 0;
  const size_t smem = (static_cast<size_t>(2) * (E + 1) * 4 + 15) / 16 * 16 +
                      static_cast<size_t>(R) * p.K * sizeof(bf16_t);
  if (smem > 48 * 1024) {  // (past 48 KiB must be asked for, per device)
    const cudaError_t e = cudaFuncSetAttribute(
        MoeGemvKernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid((p.N + kRowsPerBlock - 1) / kRowsPerBlock, tiles);
  return LaunchPdl(MoeGemvKernel<R>, grid, dim3(kGemvWarps * 32), smem, launch, p);
}

cudaError_t LaunchRows(const MoeGemmParams& p, int tiles, LaunchConfig launch) {
  switch (MoeGemvPassRows(p.max_group_rows)) {
    case 1:
      return LaunchFor<1>(p, tiles, launch);
    case 2:
      return LaunchFor<2>(p, tiles, launch);
    case 4:
      return LaunchFor<4>(p, tiles, launch);
    default:
      return LaunchFor<8>(p, tiles, launch);
  }
}

}  // namespace

cudaError_t LaunchMoeGemv(const MoeGemmParams& p, LaunchConfig launch) {
  if (p.num_experts <= 0 || p.div <= 0 || !MoeGemvTakes(p.N, p.K, p.format, p.max_group_rows))
    return cudaErrorInvalidValue;
  if (!MoeEpilogueOutputsOk(p)) return cudaErrorInvalidValue;
  if (p.offsets != nullptr && (p.tiles == nullptr || p.num_experts > kMaxMoeExperts))
    return cudaErrorInvalidValue;
  switch (p.format) {
    case MoeWeightFormat::kBf16:
      if (p.w == nullptr) return cudaErrorInvalidValue;
      break;
    case MoeWeightFormat::kFp8Block:
      if (p.wq == nullptr || p.scales == nullptr || p.block_rows <= 0 || p.block_cols <= 0 ||
          p.block_cols % 16 != 0 || (p.scale_pairs && p.N % 2 != 0))
        return cudaErrorInvalidValue;
      break;
    case MoeWeightFormat::kMxfp4:
      if (p.wq == nullptr || p.exps == nullptr) return cudaErrorInvalidValue;
      break;
  }
  const int tiles = p.offsets != nullptr ? p.max_tiles : (p.rows + kMoeTileRows - 1) / kMoeTileRows;
  if (tiles <= 0) return cudaSuccess;
  if (tiles > 65535) return cudaErrorInvalidValue;  // (the grid's y extent)
  if (p.format != MoeWeightFormat::kBf16) return LaunchMoeGemvMma(p, tiles, launch);
  return LaunchRows(p, tiles, launch);
}

}  // namespace agentkv::backend::cuda::kernels
