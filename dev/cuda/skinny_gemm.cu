// Tensor-core GEMM for decode steps of 3 to 8 rows: y = x . w^T with the
// weights streamed from memory once. A block owns 128 output features
// (eight warps of 16) and all M rows of x, computing y^T = w . x^T with w
// as the mma A operand (16 features x 16 k) and x as B (16 k x 8 rows).
// When the feature tiles alone are too few to keep every SM streaming, K is
// split across the blocks of a thread-block cluster (Hopper): each leaves
// its fp32 partial tile in its shared memory and then sums one slice of the
// tile over all the cluster's blocks (distributed shared memory), in rank
// order, so the result does not depend on timing.
//
// Measured against cuBLAS on the Llama-3.2-1B shapes (bench/RESULTS.md):
// ahead by 3-13% at 8 rows in a graph of back-to-back launches, behind from
// 16 rows on; inside a decode step it lost (c8 4,700 -> 4,560 tok/s), so
// the backend never used it (dev/cuda/README.md). Two earlier
// designs lost everywhere and are gone: partials met in global memory and
// added by the last block of a tile (its serial reads made o and down 2-4x
// slower), and weights staged through a cp.async pipeline in swizzled
// shared memory (at best level with cuBLAS).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "dev/cuda/skinny_gemm.h"
#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/mma.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = kWarps * 16;  // features per block
constexpr int kMaxSplits = 8;        // the portable cluster size

// Stores one lane's accumulator fragment of row tile j of warp `warp`:
// features n0 + warp * 16 + lane / 4 (+ 8), rows j * 8 + 2 * (lane % 4) (+ 1).
__device__ __forceinline__ void StoreFragment(const kernels::GemmArgs& a, const float (&v)[4],
                                              int n0, int warp, int j, int lane) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int m = j * 8 + 2 * (lane & 3) + (e & 1);
    const int n = n0 + warp * 16 + (lane >> 2) + (e >> 1) * 8;
    if (m >= a.M || n >= a.N) continue;
    const int64_t at = static_cast<int64_t>(m) * a.N + n;
    if (a.y_f32) {
      float* yf = static_cast<float*>(a.y);
      yf[at] = a.beta != 0.f ? a.beta * yf[at] + v[e] : v[e];
    } else {
      kernels::bf16* yb = static_cast<kernels::bf16*>(a.y);
      yb[at] = __float2bfloat16_rn(a.beta != 0.f ? a.beta * __bfloat162float(yb[at]) + v[e] : v[e]);
    }
  }
}

// The block's accumulators (features n0 + 16 * warp + ..., all rows) to y:
// directly, or with K split over the cluster's blocks, through their shared
// memory (at least kWarps * MT * 512 bytes at `smem`, free to overwrite).
template <int MT>
__device__ __forceinline__ void Finish(const kernels::GemmArgs& a, const float (&acc)[MT][4],
                                       int n0, int splits, unsigned char* smem) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (splits == 1) {
#pragma unroll
    for (int j = 0; j < MT; ++j) StoreFragment(a, acc[j], n0, warp, j, lane);
    return;
  }
  __syncthreads();  // every warp is done reading its operands from smem
  constexpr int kFrags = kWarps * MT * 32;
  float4* part = reinterpret_cast<float4*>(smem);
#pragma unroll
  for (int j = 0; j < MT; ++j)
    part[(warp * MT + j) * 32 + lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  const int per = kFrags / splits;
  for (int idx = rank * per + tid; idx < (rank + 1) * per; idx += kThreads) {
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < splits; ++s) {
      const float4 p = cluster.map_shared_rank(part, s)[idx];
      v[0] += p.x;
      v[1] += p.y;
      v[2] += p.z;
      v[3] += p.w;
    }
    StoreFragment(a, v, n0, idx / (MT * 32), (idx / 32) % MT, idx % 32);
  }
  cluster.sync();  // the peers read this block's shared memory until here
}

// Weights straight from memory into mma A fragments, x through shared
// memory. The order of k inside an mma does not matter as long as A and B
// agree, so lane (g, t) loads 16 contiguous bytes of rows g and g + 8 at
// k = 32 s + 8 t and uses them for two k16 steps (a GEMV-like 16-byte
// stream, no shared memory or ldmatrix for the weights); its x fragment is
// the same 16 bytes of row g of x. x comes in chunks of kChunk k,
// double-buffered with cp.async; the weights of the next chunk are in
// registers before the current one is multiplied.
constexpr int kChunk = 128;
constexpr int kXStride = kChunk + 32;  // bf16; rows 2g and 2g+1 in other banks

template <int MT>
__global__ void __launch_bounds__(kThreads) DirectGemmKernel(const kernels::GemmArgs a) {
  constexpr int kRowsX = MT * 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  kernels::bf16* xs = reinterpret_cast<kernels::bf16*>(smem_raw);  // [2][kRowsX][kXStride]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.y, splits = gridDim.y;
  const int N = a.N, K = a.K, M = a.M;
  const int n0 = blockIdx.x * kTileN;
  const int chunks = K / kChunk;
  const int cb = split * chunks / splits, nc = (split + 1) * chunks / splits - cb;
  const int64_t r0 = min(n0 + warp * 16 + g, N - 1), r1 = min(n0 + warp * 16 + g + 8, N - 1);
  const uint4* w0 = reinterpret_cast<const uint4*>(a.w + r0 * K) + t;
  const uint4* w1 = reinterpret_cast<const uint4*>(a.w + r1 * K) + t;

  uint4 wn[2][kChunk / 32];  // the next chunk's weights: rows g and g + 8
  auto load_w = [&](int c) {
    const int v0 = (cb + c) * (kChunk / 8);  // 16-byte vectors into a row
#pragma unroll
    for (int s = 0; s < kChunk / 32; ++s) {
      wn[0][s] = __ldg(w0 + v0 + s * 4);
      wn[1][s] = __ldg(w1 + v0 + s * 4);
    }
  };
  auto load_x = [&](int c) {
    kernels::bf16* dst = xs + (c & 1) * kRowsX * kXStride;
    const int64_t k0 = static_cast<int64_t>(cb + c) * kChunk;
    for (int i = tid; i < kRowsX * (kChunk / 8); i += kThreads) {
      const int r = i / (kChunk / 8), ch = i % (kChunk / 8);
      const bool valid = r < M;  // rows past M are zero-filled
      kernels::CpAsync16(dst + r * kXStride + ch * 8,
                         a.x + static_cast<int64_t>(valid ? r : 0) * K + k0 + ch * 8, valid);
    }
    kernels::CpAsyncCommit();
  };

  load_w(0);  // weights are never written by a step: before the wait
  kernels::PdlLaunchDependents();
  kernels::PdlWait();
  load_x(0);

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int c = 0; c < nc; ++c) {
    uint4 wc[2][kChunk / 32];
#pragma unroll
    for (int s = 0; s < kChunk / 32; ++s) {
      wc[0][s] = wn[0][s];
      wc[1][s] = wn[1][s];
    }
    if (c + 1 < nc) {
      load_w(c + 1);
      load_x(c + 1);
      kernels::CpAsyncWait<1>();
    } else {
      kernels::CpAsyncWait<0>();
    }
    __syncthreads();  // chunk c of x is in for every thread
    const kernels::bf16* xc = xs + (c & 1) * kRowsX * kXStride + g * kXStride + t * 8;
#pragma unroll
    for (int s = 0; s < kChunk / 32; ++s) {
      const uint32_t a0[4] = {wc[0][s].x, wc[1][s].x, wc[0][s].y, wc[1][s].y};
      const uint32_t a1[4] = {wc[0][s].z, wc[1][s].z, wc[0][s].w, wc[1][s].w};
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xc + j * 8 * kXStride + s * 32);
        kernels::Mma(acc[j], a0, xv.x, xv.y);
        kernels::Mma(acc[j], a1, xv.z, xv.w);
      }
    }
    __syncthreads();  // buffer c & 1 is refilled with chunk c + 2 next
  }
  Finish<MT>(a, acc, n0, splits, smem_raw);
}

template <typename Kernel>
cudaError_t LaunchClustered(Kernel kernel, const kernels::GemmArgs& a, int splits, size_t smem,
                            kernels::LaunchConfig launch) {
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const int tiles = (a.N + kTileN - 1) / kTileN;
  return LaunchPdlClustered(kernel, dim3(tiles, splits), dim3(kThreads), smem, splits, launch, a);
}

template <int MT>
cudaError_t LaunchMt(const kernels::GemmArgs& a, int splits, kernels::LaunchConfig launch) {
  const size_t smem = static_cast<size_t>(2) * MT * 8 * kXStride * sizeof(kernels::bf16);
  return LaunchClustered(DirectGemmKernel<MT>, a, splits, smem, launch);
}

}  // namespace

bool SkinnyGemmSupported(int m, int n, int k) {
  return m >= 1 && m <= kMaxSkinnyRows && n >= 1 && k >= kChunk && k % kChunk == 0;
}

int SkinnyGemmSplits(int n, int k, int num_sms) {
  const int tiles = (n + kTileN - 1) / kTileN, chunks = k / kChunk;
  int splits = 1;
  // About one block per SM (two per SM measured slower); each split keeps at
  // least two chunks, so that loading the next one overlaps the multiplying.
  while (splits < kMaxSplits && tiles * splits < num_sms && chunks / (splits * 2) >= 2) splits *= 2;
  return splits;
}

cudaError_t LaunchSkinnyGemm(const kernels::bf16_t* x, const kernels::bf16_t* w, void* y,
                             bool y_f32, int m, int n, int k, float beta, int num_sms,
                             kernels::LaunchConfig launch, int splits) {
  if (!SkinnyGemmSupported(m, n, k) || num_sms <= 0) return cudaErrorInvalidValue;
  if (splits == 0) splits = SkinnyGemmSplits(n, k, num_sms);
  if (splits < 1 || splits > kMaxSplits || (splits & (splits - 1)) != 0 || splits > k / kChunk)
    return cudaErrorInvalidValue;
  const kernels::GemmArgs a{reinterpret_cast<const kernels::bf16*>(x),
                            reinterpret_cast<const kernels::bf16*>(w),
                            y,
                            m,
                            n,
                            k,
                            beta,
                            y_f32};
  return LaunchMt<1>(a, splits, launch);
}

}  // namespace agentkv::backend::cuda
