// Hopper warpgroup GEMM (wgmma) for decode steps of 9 to 64 rows:
// y = x . w^T with the weights streamed once and the first stages of them
// requested before the programmatic-launch wait, so that a step's GEMM
// ramps up while the kernel before it finishes (cuBLAS's kernels start
// cold: at 64 rows its o and QKV projections ran at 1.0-1.6 TB/s).
//
// One warpgroup per block computes y^T tiles: A = 64 weight rows (features)
// x 16 k, B = the 64 (zero-padded) rows of x x 16 k, both K-major in shared
// memory with the 128-byte swizzle, so D is [feature][row] in registers.
// A stage holds 64 or 128 k of NT * 64 features and of x; all 128 threads
// copy stages in with cp.async, 3-6 deep. Where the feature tiles are too
// few to occupy the GPU, K is split across the blocks of a cluster, whose
// fp32 partial tiles are added through distributed shared memory in rank
// order (deterministic).
//
// Built for sm_90a only (wgmma has no portable form); the backend calls it
// on compute capability 9.0 devices, and only where AGENTKV_CUDA_WGMMA asks.
// Measured at 64 rows on the Llama-3.2-1B shapes (bench/RESULTS.md item 43;
// cuBLAS in brackets, us per launch in a graph): gate_up 27.4 (28.2), qkv
// 8.2 (7.7), o 7.7 (6.6), down 24 (17.5): the per-row DRAM chunks of a
// stage are short and the x tile is re-read by every block. Inside decode
// steps (PDL overlap included) c16-c64 came out level with cuBLAS, within
// the run-to-run spread, so it stays opt-in, as the base for GEMMs with the
// norm and activation fused.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "engine/cuda/attention_common.cuh"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/mma.cuh"
#include "engine/cuda/pdl.cuh"

namespace agentkv::cuda {
namespace {

constexpr int kThreads = 128;               // one warpgroup
constexpr int kRows = 64;                   // wgmma N: x rows, zero-filled from m on
constexpr int kAtomK = 64;                  // k of one 128-byte swizzled row
constexpr int kSubBytes = 64 * kAtomK * 2;  // one m64 operand tile, 8 KiB
constexpr int kMaxSplits = 8;
constexpr int kPartStride = 4;  // floats of padding per row of the partial tile

// NT m64 feature tiles per block, S stages of A * 64 k.
template <int NT, int S, int A>
struct Cfg {
  static constexpr int kTileN = 64 * NT;  // features per block
  static constexpr int kBK = kAtomK * A;  // k per stage
  static constexpr int kWBytes = A * NT * kSubBytes;
  static constexpr int kStageBytes = kWBytes + A * kSubBytes;
  static constexpr int kStages = S;
  static constexpr int kPartFloats = kRows * (kTileN + kPartStride);
  static constexpr size_t kSmem =
      1024 + (kStages * kStageBytes > kPartFloats * 4 ? kStages * kStageBytes : kPartFloats * 4);
};

// A K-major operand of 64 rows x 16 k at `saddr` (inside a 1024-byte aligned
// tile of 128-byte rows, 128-byte swizzle): 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t Desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// `rows` rows of A * 64 k (from column k0 of a row-major [.][ld] bf16
// matrix) into A swizzled tiles of 64 k at sbase, rows * 128 bytes apart:
// chunk c of row r lands at chunk c ^ (r % 8). Rows from `valid` on are
// zero-filled (nothing read).
template <int A>
__device__ __forceinline__ void LoadTile(uint32_t sbase, const bf16* g, int64_t ld, int rows,
                                         int valid, int64_t k0, int tid) {
  for (int i = tid; i < rows * 8 * A; i += kThreads) {
    const int r = i / (8 * A), c = i % (8 * A), at = c >> 3, cc = c & 7;
    const bool ok = r < valid;
    const bf16* src = g + static_cast<int64_t>(ok ? r : 0) * ld + k0 + c * 8;
    const uint32_t dst = sbase + at * rows * 128 + r * 128 + ((cc ^ (r & 7)) << 4);
    CpAsync16At(dst, src, ok);
  }
}

__device__ __forceinline__ void Wgmma(float (&d)[32], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
#endif
}

// Keeps the compiler from moving uses of the accumulators across the
// asynchronous wgmma's wait.
__device__ __forceinline__ void FenceOperands(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int NT, int S, int A>
__global__ void __launch_bounds__(kThreads) WgmmaGemmKernel(const GemmArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<NT, S, A>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;  // the swizzle atoms are 1024-byte aligned
  float* part = reinterpret_cast<float*>(smem_raw + (base - raw));
  const int tid = threadIdx.x;
  const int N = a.N, K = a.K, M = a.M;
  const int n0 = blockIdx.x * C::kTileN;
  const int split = blockIdx.y, splits = gridDim.y;
  const int nk_all = K / C::kBK;
  const int kb = split * nk_all / splits, nk = (split + 1) * nk_all / splits - kb;
  const bf16* wg = a.w + static_cast<int64_t>(n0) * K;
  const int wrows = min(C::kTileN, N - n0);
  auto kof = [&](int i) { return static_cast<int64_t>(kb + i) * C::kBK; };
  auto wslot = [&](int s) { return base + s * C::kStageBytes; };
  auto xslot = [&](int s) { return base + s * C::kStageBytes + C::kWBytes; };

  // Weights are written by no kernel of a step: the first stages of them go
  // out before the wait, while the kernel before this one finishes.
#pragma unroll 1
  for (int s = 0; s < C::kStages - 1 && s < nk; ++s)
    LoadTile<A>(wslot(s), wg, K, C::kTileN, wrows, kof(s), tid);
  PdlLaunchDependents();
  PdlWait();
  // Group s holds x's stage s (group 0 also every early weight stage).
#pragma unroll 1
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nk) LoadTile<A>(xslot(s), a.x, K, kRows, M, kof(s), tid);
    CpAsyncCommit();
  }

  float acc[NT][32];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[t][i] = 0.f;

#pragma unroll 1
  for (int i = 0; i < nk; ++i) {
    CpAsyncWait<C::kStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // stage i is in; every thread is done with stage i - 1
    const int nx = i + C::kStages - 1;
    if (nx < nk) {
      const int s = nx % C::kStages;
      LoadTile<A>(wslot(s), wg, K, C::kTileN, wrows, kof(nx), tid);
      LoadTile<A>(xslot(s), a.x, K, kRows, M, kof(nx), tid);
    }
    CpAsyncCommit();
    const int s = i % C::kStages;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < C::kBK / 16; ++kk) {
      const int at = kk >> 2, k16 = (kk & 3) * 32;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        Wgmma(acc[t], Desc(wslot(s) + (at * NT + t) * kSubBytes + k16),
              Desc(xslot(s) + at * kSubBytes + k16));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int t = 0; t < NT; ++t) FenceOperands(acc[t]);
  }
  CpAsyncWait<0>();
  __syncthreads();  // the stages' memory becomes the partial tile

  // D fragment of warp w: features 16 w + lane / 4 (+ 8), rows 8 j + 2 (lane % 4) (+ 1).
  constexpr int PS = C::kTileN + kPartStride;
  const int warp = tid >> 5, lane = tid & 31;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int f = t * 64 + 16 * warp + (lane >> 2) + (e >> 1) * 8;
        const int r = 8 * j + 2 * (lane & 3) + (e & 1);
        part[r * PS + f] = acc[t][4 * j + e];
      }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (splits > 1) {
    cluster.sync();
  } else {
    __syncthreads();
  }
  // Each rank adds and stores a share of the tile's float4s, rows first.
  constexpr int kVecs = kRows * C::kTileN / 4;
  const int rank = splits > 1 ? static_cast<int>(cluster.block_rank()) : 0;
  const int per = (kVecs + splits - 1) / splits;
  const int lo = rank * per, hi = min(kVecs, lo + per);
  for (int v = lo + tid; v < hi; v += kThreads) {
    const int r = v / (C::kTileN / 4), f = (v % (C::kTileN / 4)) * 4;
    if (r >= M || n0 + f >= N) continue;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {
      const float* src = splits > 1 ? cluster.map_shared_rank(part, q) : part;
      const float4 p = *reinterpret_cast<const float4*>(src + r * PS + f);
      s.x += p.x;
      s.y += p.y;
      s.z += p.z;
      s.w += p.w;
    }
    const int64_t at = static_cast<int64_t>(r) * N + n0 + f;
    if (a.y_f32) {
      float4* yp = reinterpret_cast<float4*>(static_cast<float*>(a.y) + at);
      if (a.beta != 0.f) {
        const float4 o = *yp;
        s.x += a.beta * o.x;
        s.y += a.beta * o.y;
        s.z += a.beta * o.z;
        s.w += a.beta * o.w;
      }
      *yp = s;
    } else {
      __nv_bfloat162* yp = reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(a.y) + at);
      if (a.beta != 0.f) {
        const float2 o0 = __bfloat1622float2(yp[0]), o1 = __bfloat1622float2(yp[1]);
        s.x += a.beta * o0.x;
        s.y += a.beta * o0.y;
        s.z += a.beta * o1.x;
        s.w += a.beta * o1.y;
      }
      yp[0] = __floats2bfloat162_rn(s.x, s.y);
      yp[1] = __floats2bfloat162_rn(s.z, s.w);
    }
  }
  if (splits > 1) cluster.sync();  // peers read this block's tile until here
#endif
}

template <int NT, int S, int A>
cudaError_t LaunchNt(const GemmArgs& a, int splits, cudaStream_t stream) {
  using C = Cfg<NT, S, A>;
  if (a.K % C::kBK != 0 || a.K / C::kBK < splits) return cudaErrorInvalidValue;
  static bool raised = false;
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(
        WgmmaGemmKernel<NT, S, A>, cudaFuncAttributeMaxDynamicSharedMemorySize, int{C::kSmem});
    if (e != cudaSuccess) return e;
    raised = true;
  }
  return LaunchPdlClustered(WgmmaGemmKernel<NT, S, A>,
                            dim3((a.N + C::kTileN - 1) / C::kTileN, splits), dim3(kThreads),
                            C::kSmem, splits, stream, a);
}

}  // namespace

bool WgmmaGemmSupported(int m, int n, int k) {
  return m >= 1 && m <= kMaxWgmmaRows && n >= 64 && n % 64 == 0 && k >= kAtomK && k % kAtomK == 0;
}

WgmmaGemmPlan WgmmaGemmPlanFor(int n, int k, int num_sms) {
  // Tiles of 64 features, at most two blocks per SM (96 KiB each); K split
  // over a cluster while each split keeps four stages or more. Stages of
  // 128 k where K allows (2-10% faster than 64 in the benchmark).
  WgmmaGemmPlan p;
  p.tile = 64;
  p.k128 = k % 128 == 0;
  const int tiles = n / p.tile, stages = k / (p.k128 ? 128 : 64);
  while (p.splits < kMaxSplits && tiles * p.splits <= num_sms && stages / (p.splits * 2) >= 4)
    p.splits *= 2;
  return p;
}

cudaError_t LaunchWgmmaGemm(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n,
                            int k, float beta, int num_sms, cudaStream_t stream,
                            WgmmaGemmPlan plan) {
  if (!WgmmaGemmSupported(m, n, k) || num_sms <= 0) return cudaErrorInvalidValue;
  if (plan.tile == 0) plan = WgmmaGemmPlanFor(n, k, num_sms);
  if ((plan.tile != 64 && plan.tile != 128) || n % plan.tile != 0 || plan.splits < 1 ||
      plan.splits > kMaxSplits)
    return cudaErrorInvalidValue;
  const GemmArgs a{
      reinterpret_cast<const bf16*>(x), reinterpret_cast<const bf16*>(w), y, m, n, k, beta, y_f32};
  if (plan.tile == 128)
    return plan.k128 ? LaunchNt<2, 4, 2>(a, plan.splits, stream)
                     : LaunchNt<2, 5, 1>(a, plan.splits, stream);
  return plan.k128 ? LaunchNt<1, 3, 2>(a, plan.splits, stream)
                   : LaunchNt<1, 6, 1>(a, plan.splits, stream);
}

}  // namespace agentkv::cuda
