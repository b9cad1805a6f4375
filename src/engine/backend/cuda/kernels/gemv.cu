// Weight-streaming GEMM for decode steps of a few rows: y[m][n] = x[m] . w[n]
// (+ beta * y), the weights read once, 16 bytes per lane per load with
// several loads in flight, all M rows of x from shared memory. cuBLAS picks
// tensor-core tiles built for larger M; at M <= 8 this kernel reads the
// weights closer to the memory bandwidth.
//
// A row of w is split across S warps when it is long (K >= 4096), so that
// each warp issues all its loads in one round instead of several dependent
// ones; the partial sums meet in shared memory. The norm variant computes
// RMSNorm of fp32 x into the staged bf16 copy itself (one kernel instead of
// two) while its first weight loads are already in flight.
#include <cuda_bf16.h>

#include <algorithm>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/gemv.h"
#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 8;    // 16-byte weight loads in flight per lane
constexpr int kNormVecs = 4;  // norm variant: float4s of x per thread, K <= 4096
static_assert(kNormVecs * kWarps * 32 * 4 == kMaxNormGemvK);

struct GemvArgs {
  const void* x;        // bf16 [M][K], or fp32 [M][K] for the norm variant
  const float* norm_w;  // norm variant: [K]
  float eps;
  bool plus_one;
  const bf16_t* w;  // [N][K]
  void* y;          // [M][N], fp32 or bf16
  int N, K;
  float beta;
  bool y_f32;
  int act;  // kAct variant: the activation (Activate's codes)
};

__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The pieces both GEMV kernels share (blocks of kWarps warps).
// The norm weights, in registers before the PDL wait (they are weights too:
// after the wait the only round trip before the reduction is x's).
__device__ __forceinline__ void LoadNormWeights(const GemvArgs& a, float4 (&g)[kNormVecs]) {
  const float4* gw = reinterpret_cast<const float4*>(a.norm_w);
#pragma unroll
  for (int j = 0; j < kNormVecs; ++j) {
    const int i = threadIdx.x + j * kWarps * 32;
    g[j] = i < a.K / 4 ? __ldg(gw + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (a.plus_one) g[j] = make_float4(1.f + g[j].x, 1.f + g[j].y, 1.f + g[j].z, 1.f + g[j].w);
  }
}

// x into xs as bf16 [M][K]: copied, or (kNorm) RMSNorm of the fp32 rows.
// For kNorm, x is held in registers from one round of independent loads
// (the loop that read it twice from memory cost ~8 us per launch at one
// row). Ends with the block synchronised; part is scratch.
template <int M, bool kNorm>
__device__ __forceinline__ void StageX(const GemvArgs& a, const float4 (&g)[kNormVecs], bf16_t* xs,
                                       float (&part)[kWarps][M]) {
  const int K = a.K;
  if constexpr (kNorm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4* xf = static_cast<const float4*>(a.x);
    const int nv = K / 4;
    float4 xv[M][kNormVecs];
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ss[m] = 0.f;
#pragma unroll
      for (int j = 0; j < kNormVecs; ++j) {
        const int i = threadIdx.x + j * kWarps * 32;
        xv[m][j] = i < nv ? xf[m * nv + i] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss[m] += xv[m][j].x * xv[m][j].x + xv[m][j].y * xv[m][j].y + xv[m][j].z * xv[m][j].z +
                 xv[m][j].w * xv[m][j].w;
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ss[m] = WarpSum(ss[m]);
      if (lane == 0) part[warp][m] = ss[m];
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float t = 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) t += part[i][m];
      const float inv = 1.0f / sqrtf(t / K + a.eps);
#pragma unroll
      for (int j = 0; j < kNormVecs; ++j) {
        const int i = threadIdx.x + j * kWarps * 32;
        if (i >= nv) break;
        const __nv_bfloat162 lo =
            __floats2bfloat162_rn(xv[m][j].x * inv * g[j].x, xv[m][j].y * inv * g[j].y);
        const __nv_bfloat162 hi =
            __floats2bfloat162_rn(xv[m][j].z * inv * g[j].z, xv[m][j].w * inv * g[j].w);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        reinterpret_cast<uint2*>(xs + m * K)[i] = packed;
      }
    }
  } else {
    const int kv = K / 8;
    for (int i = threadIdx.x; i < M * kv; i += blockDim.x)
      reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(a.x)[i];
  }
  __syncthreads();  // xs ready; part free again
}

// acc[m] += the 8 weights of w . the 16-byte vector v of row m of xs.
template <int M>
__device__ __forceinline__ void Dot8(const uint4& w, const bf16_t* xs, int K, int v,
                                     float (&acc)[M]) {
  float wf[8];
  Unpack(w, wf);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[8];
    Unpack(reinterpret_cast<const uint4*>(xs + m * K)[v], xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[e], xf[e], acc[m]);
  }
}

// Lane m < M writes row n of y[m] (+ beta * y), from acc (reduced, the same
// in every lane).
template <int M>
__device__ __forceinline__ void StoreRow(const GemvArgs& a, int n, int lane,
                                         const float (&acc)[M]) {
  if (lane >= M) return;
  float v = 0.f;
#pragma unroll
  for (int m = 0; m < M; ++m)
    if (m == lane) v = acc[m];
  const int64_t at = static_cast<int64_t>(lane) * a.N + n;
  if (a.y_f32) {
    float* yf = static_cast<float*>(a.y);
    yf[at] = a.beta != 0.f ? a.beta * yf[at] + v : v;
  } else {
    __nv_bfloat16* yb = static_cast<__nv_bfloat16*>(a.y);
    yb[at] = __float2bfloat16_rn(a.beta != 0.f ? a.beta * __bfloat162float(yb[at]) + v : v);
  }
}

// M rows of x; S warps per row of w; kNorm: x is fp32 and normalised here;
// kAct: rows of w come in (gate, up) pairs and y is act(gate) * up, bf16
// [M][N / 2].
template <int M, int S, bool kNorm, bool kAct>
__device__ __forceinline__ void GemvBody(const GemvArgs& a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float part[kWarps][M];
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem);
  const int N = a.N, K = a.K;
  const int kvs = K / 8 / S;  // 16-byte vectors of a row per warp
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  constexpr int kRowsPerBlock = kWarps / S;
  const int n = blockIdx.x * kRowsPerBlock + warp / S;
  const int j0 = (warp % S) * kvs;
  const uint4* wr = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(n) * K);
  // The first weight loads go out before x is staged (and, launched as a
  // dependent, before the kernel that writes x has finished): weights are
  // never written by a step.
  uint4 pre[kUnroll];
  bool have_pre = n < N && lane + 32 * (kUnroll - 1) < kvs;
  if (have_pre) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) pre[u] = __ldg(wr + j0 + lane + 32 * u);
  }
  float4 g[kNormVecs];
  if constexpr (kNorm) LoadNormWeights(a, g);
  PdlLaunchDependents();
  PdlWait();
  StageX<M, kNorm>(a, g, xs, part);

  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  if (n < N) {
    const int jend = j0 + kvs;
    int j = j0 + lane;
    for (; j + 32 * (kUnroll - 1) < jend; j += 32 * kUnroll) {
      uint4 wv[kUnroll];
      if (have_pre) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = pre[u];
        have_pre = false;
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = __ldg(wr + j + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) Dot8<M>(wv[u], xs, K, j + 32 * u, acc);
    }
    for (; j < jend; j += 32) Dot8<M>(__ldg(wr + j), xs, K, j, acc);
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = WarpSum(acc[m]);
  }
  if constexpr (S > 1) {
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) part[warp][m] = acc[m];
    }
    __syncthreads();
    if (warp % S == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float t = 0.f;
#pragma unroll
        for (int s = 0; s < S; ++s) t += part[warp + s][m];
        acc[m] = t;
      }
    }
  }
  if constexpr (kAct) {
    // A block's rows are whole (gate, up) pairs (kRowsPerBlock is even).
    __shared__ float rowv[kRowsPerBlock][M];
    if (warp % S == 0 && lane < M) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (m == lane) rowv[warp / S][m] = acc[m];
    }
    __syncthreads();
    const int pairs = kRowsPerBlock / 2;
    if (threadIdx.x < pairs * M) {
      const int pr = threadIdx.x / M, m = threadIdx.x % M;
      const int i = blockIdx.x * pairs + pr;
      if (2 * i + 1 < N) {
        const __nv_bfloat16 r =
            __float2bfloat16_rn(Activate(rowv[2 * pr][m], a.act) * rowv[2 * pr + 1][m]);
        static_cast<__nv_bfloat16*>(a.y)[static_cast<int64_t>(m) * (N / 2) + i] = r;
      }
    }
    return;
  }
  if (n < N && warp % S == 0) StoreRow<M>(a, n, lane, acc);
}

template <int M, int S, bool kNorm, bool kAct>
__global__ void __launch_bounds__(kWarps * 32) GemvKernel(const GemvArgs a) {
  GemvBody<M, S, kNorm, kAct>(a);
}

// The one-row norm GEMV (the QKV projection: 384 blocks for the 1B shape)
// took 90 registers, 2 blocks per SM and two waves; held to 80, 3 blocks
// and one wave. (A minimum on GemvKernel itself made the compiler spill
// in the other variants.)
template <int S>
__global__ void __launch_bounds__(kWarps * 32, 3) NormGemv1Kernel(const GemvArgs a) {
  GemvBody<1, S, true, false>(a);
}

// Pipelined variant: every warp streams its own rows through a ring of
// kStages shared-memory stages of 4 KiB (cp.async, 16 bytes per lane), so a
// warp always has kStages - 1 stages in flight while it computes one; the
// grid is one wave (blocks_per_sm per SM) and a warp walks its rows (whole
// (gate, up) pairs for kAct) a grid's warps apart. The first kStages stages
// are requested before the PDL wait. Long rows are several stages (chunks).
constexpr int kStageVecs = 32 * kUnroll;  // 16-byte vectors per warp stage

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int M, int kStages, bool kNorm, bool kAct>
__global__ void __launch_bounds__(kWarps * 32) GemvPipeKernel(const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float part[kWarps][M];
  const int N = a.N, K = a.K;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint4* ring = reinterpret_cast<uint4*>(smem) + warp * kStages * kStageVecs;
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + kWarps * kStages * kStageVecs * 16);
  const int kv = K / 8;
  const int cpr = (kv + kStageVecs - 1) / kStageVecs;  // chunks per row
  const int gw = blockIdx.x * kWarps + warp;
  const int tw = gridDim.x * kWarps;
  // Rows of this warp: units u = 0, 1, ...; kAct takes pairs (2 units each).
  const int units = kAct ? 2 * ((N / 2 - gw + tw - 1) / tw) : (N - gw + tw - 1) / tw;
  const int items = units > 0 ? units * cpr : 0;
  auto row_of = [&](int u) { return kAct ? 2 * (gw + (u >> 1) * tw) + (u & 1) : gw + u * tw; };
  auto issue = [&](int i) {
    if (i < items) {
      const int c = i % cpr;
      const uint4* wr =
          reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(row_of(i / cpr)) * K);
      uint4* dst = ring + (i % kStages) * kStageVecs;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = c * kStageVecs + lane + 32 * u;
        if (v < kv) CpAsync16(dst + lane + 32 * u, wr + v);
      }
    }
    CpAsyncCommit();  // one group per item, empty past the end
  };
#pragma unroll
  for (int s = 0; s < kStages; ++s) issue(s);

  float4 g[kNormVecs];
  if constexpr (kNorm) LoadNormWeights(a, g);
  PdlLaunchDependents();
  PdlWait();
  StageX<M, kNorm>(a, g, xs, part);

  float acc[M], gate[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = gate[m] = 0.f;
  for (int i = 0; i < items; ++i) {
    CpAsyncWait<kStages - 1>();  // item i's stage (each lane reads only its own copies)
    const int c = i % cpr;
    const uint4* st = ring + (i % kStages) * kStageVecs;
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = st[lane + 32 * u];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = c * kStageVecs + lane + 32 * u;
      if (v < kv) Dot8<M>(wv[u], xs, K, v, acc);
    }
    issue(i + kStages);  // into the stage just read (its values are in registers)
    if (c != cpr - 1) continue;
    const int u = i / cpr, n = row_of(u);
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = WarpSum(acc[m]);
    if constexpr (kAct) {
      if ((u & 1) == 0) {
#pragma unroll
        for (int m = 0; m < M; ++m) gate[m] = acc[m];
      } else if (lane < M) {
        float v = 0.f, gv = 0.f;
#pragma unroll
        for (int m = 0; m < M; ++m)
          if (m == lane) v = acc[m], gv = gate[m];
        static_cast<__nv_bfloat16*>(a.y)[static_cast<int64_t>(lane) * (N / 2) + n / 2] =
            __float2bfloat16_rn(Activate(gv, a.act) * v);
      }
    } else {
      StoreRow<M>(a, n, lane, acc);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
  }
  CpAsyncWait<0>();
}

int NumSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 1;
    return n;
  }();
  return sms;
}

// 4 stages per warp (16 KiB), one block of 8 warps per SM: measured against
// 2 stages at 2 blocks per SM, 3 stages, and 4 at 2 blocks per SM
// (bench/RESULTS.md); Launch's `pipe` false keeps every shape on
// GemvKernel (for comparison; CudaTuning::gemv_pipe).
constexpr int kPipeStages = 4;
// The long-row GEMV (the MLP's down projection) follows the pipelined
// gate_up kernel: with 2 stages (64 KiB) its block fits on an SM beside
// that kernel's 133 KiB and is resident, prefetching, while it runs; with
// 4 it waited for the SM to empty (c1 889 -> 910 tok/s, bench/RESULTS.md).
constexpr int kPipeStagesDown = 2;

template <int M, bool kNorm, bool kAct, int kStages = kPipeStages>
cudaError_t LaunchPipe(const GemvArgs& a, LaunchConfig launch) {
  const size_t smem = static_cast<size_t>(kWarps) * kStages * kStageVecs * 16 +
                      static_cast<size_t>(M) * a.K * sizeof(bf16_t);
  auto kernel = GemvPipeKernel<M, kStages, kNorm, kAct>;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int units = kAct ? a.N / 2 : a.N;
  const int blocks = std::max(1, std::min(NumSms(), (units + kWarps - 1) / kWarps));
  return LaunchPdl(kernel, dim3(blocks), dim3(kWarps * 32), smem, launch, a);
}

// Warps per row: enough that each warp's share is one round of loads
// (32 lanes x kUnroll x 8 elements = 2048), when K divides evenly.
int SplitFor(int k) {
  const int kv = k / 8;
  if (k >= 8192 && kv % 4 == 0) return 4;
  if (k >= 4096 && kv % 2 == 0) return 2;
  return 1;
}

template <int M, int S, bool kNorm, bool kAct>
cudaError_t LaunchS(const GemvArgs& a, LaunchConfig launch) {
  const size_t smem = static_cast<size_t>(M) * a.K * sizeof(bf16_t);
  auto kernel = M == 1 && kNorm && !kAct ? NormGemv1Kernel<S> : GemvKernel<M, S, kNorm, kAct>;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  constexpr int kRowsPerBlock = kWarps / S;
  // One row per warp group: short rows leave no time to ramp a grid-stride
  // loop.
  const int blocks = (a.N + kRowsPerBlock - 1) / kRowsPerBlock;
  return LaunchPdl(kernel, dim3(blocks), dim3(kWarps * 32), smem, launch, a);
}

template <int M, bool kNorm, bool kAct = false>
cudaError_t Launch(const GemvArgs& a, bool pipe, LaunchConfig launch) {
  // The pipelined kernel where it measured faster: the MLP norm fused into
  // the gate_up GEMV (normalising x once per SM, not once per 8 rows), and
  // rows of 8,192 and more (GemvKernel runs them in two waves).
  if (pipe && kNorm && kAct) return LaunchPipe<M, kNorm, kAct>(a, launch);
  if (pipe && !kNorm && !kAct && a.K >= 8192)
    return LaunchPipe<M, kNorm, kAct, kPipeStagesDown>(a, launch);
  switch (SplitFor(a.K)) {
    case 4:
      return LaunchS<M, 4, kNorm, kAct>(a, launch);
    case 2:
      return LaunchS<M, 2, kNorm, kAct>(a, launch);
    default:
      return LaunchS<M, 1, kNorm, kAct>(a, launch);
  }
}

}  // namespace

// x lives in shared memory: at most 32 KiB of it, so that several blocks
// share an SM and keep enough weight loads in flight.
cudaError_t LaunchGemv(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n, int k,
                       float beta, int num_sms, LaunchConfig launch, bool pipe) {
  (void)num_sms;
  if (!GemvSupported(m, k)) return cudaErrorInvalidValue;
  const GemvArgs a{x, nullptr, 0.f, false, w, y, n, k, beta, y_f32, 0};
  switch (m) {
    case 1:
      return Launch<1, false>(a, pipe, launch);
    case 2:
      return Launch<2, false>(a, pipe, launch);
    case 3:
      return Launch<3, false>(a, pipe, launch);
    case 4:
      return Launch<4, false>(a, pipe, launch);
    case 5:
      return Launch<5, false>(a, pipe, launch);
    case 6:
      return Launch<6, false>(a, pipe, launch);
    case 7:
      return Launch<7, false>(a, pipe, launch);
    default:
      return Launch<8, false>(a, pipe, launch);
  }
}

cudaError_t LaunchNormGemv(const float* x, const float* norm_w, float eps, bool plus_one,
                           const bf16_t* w, void* y, bool y_f32, int m, int n, int k, float beta,
                           LaunchConfig launch) {
  if (!NormGemvSupported(m, k)) return cudaErrorInvalidValue;
  const GemvArgs a{x, norm_w, eps, plus_one, w, y, n, k, beta, y_f32, 0};
  // (Launch has no pipelined form of this shape: `pipe` changes nothing.)
  return m == 1 ? Launch<1, true>(a, true, launch) : Launch<2, true>(a, true, launch);
}

cudaError_t LaunchGemvGatedAct(const bf16_t* x, const bf16_t* w, bf16_t* out, int m, int n, int k,
                               int act, LaunchConfig launch) {
  if (!GemvGatedActSupported(m, n, k)) return cudaErrorInvalidValue;
  const GemvArgs a{x, nullptr, 0.f, false, w, out, n, k, 0.f, false, act};
  // (Launch has no pipelined form of this shape: `pipe` changes nothing.)
  return m == 1 ? Launch<1, false, true>(a, true, launch) : Launch<2, false, true>(a, true, launch);
}

cudaError_t LaunchNormGemvGatedAct(const float* x, const float* norm_w, float eps, bool plus_one,
                                   const bf16_t* w, bf16_t* out, int m, int n, int k, int act,
                                   LaunchConfig launch) {
  if (!NormGemvGatedActSupported(m, n, k)) return cudaErrorInvalidValue;
  const GemvArgs a{x, norm_w, eps, plus_one, w, out, n, k, 0.f, false, act};
  return m == 1 ? LaunchPipe<1, true, true>(a, launch) : LaunchPipe<2, true, true>(a, launch);
}

}  // namespace agentkv::backend::cuda::kernels
