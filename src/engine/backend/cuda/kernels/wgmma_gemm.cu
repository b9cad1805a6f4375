// Hopper warpgroup GEMM (wgmma) for decode steps of up to 64 rows:
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
// few to occupy the GPU, K is split across blocks: each writes its fp32
// partial tile to a workspace, and the last block of a tile to finish adds
// them all in split order (deterministic) and stores the result. (A split
// over a thread-block cluster, added through distributed shared memory,
// was the slowest: down 24 us at 64 rows against 14.8 with planes.)
//
// Epilogues: fp32 or bf16 output, beta * y added; the gated activation
// (weight rows gate and up interleaved, as LaunchGatedAct reads them); or
// each split's fp32 plane stored as it is, for the next kernel to add
// (LaunchAddPartsRmsNorm, the fused-rotary attention): no block waits on
// another, and the last block's serial reduction (3-5 us at 64 rows,
// bench/RESULTS.md item 44) leaves the GEMM's tail. The backend uses planes
// for every split GEMM. For the LM head: each row's best feature of the
// tile (argmax), the logits stored only if a device flag asks for them.
//
// Built for sm_90a only (wgmma has no portable form); the backend calls it
// on compute capability 9.0 devices.
#include <cuda_bf16.h>

#include <climits>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/hopper.cuh"
#include "engine/backend/cuda/kernels/mma.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = 128;               // one warpgroup
constexpr int kRows = 64;                   // wgmma N: x rows, zero-filled from m on
constexpr int kAtomK = kWgmmaAtomK;         // k of one 128-byte swizzled row
constexpr int kSubBytes = 64 * kAtomK * 2;  // one m64 operand tile, 8 KiB
constexpr int kMaxSplits = kMaxWgmmaSplits;
constexpr int kPartStride = 4;  // floats of padding per row of the output tile
// Workspace: room for this many 64 x 64 fp32 partial tiles per SM, and as
// many counters.
constexpr int kWsTilesPerSm = 4;
constexpr int kSubFloats = 64 * kRows;

struct WgmmaArgs : GemmArgs {
  float* ws = nullptr;             // partial tiles, [tile][split][NT * 32 * kThreads]
  unsigned* counters = nullptr;    // per tile: splits done
  int act = -1;                    // < 0: none; else Activate's code
  bool planes = false;             // split s writes y + s * M * N; nothing added
  float2* best = nullptr;          // (kArgmax) per row, this block's best at [row][blockIdx.x]
  const int32_t* store = nullptr;  // (kArgmax) non-null: y is written only if *store != 0
};

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

// kArgmax: the LM head's epilogue (a.best, a.store); a compile-time switch,
// so that every other GEMM is built as it was without it.
template <int NT, int S, int A, bool kArgmax = false>
__global__ void __launch_bounds__(kThreads) WgmmaGemmKernel(const WgmmaArgs a) {
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
        Wgmma(acc[t], KMajorDesc(wslot(s) + (at * NT + t) * kSubBytes + k16),
              KMajorDesc(xslot(s) + at * kSubBytes + k16));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int t = 0; t < NT; ++t) FenceOperands(acc[t]);
  }
  CpAsyncWait<0>();

  if (splits > 1 && !a.planes) {
    // Partial tiles in fragment order ([NT * 8][128 threads][4] floats), so
    // that each thread writes and later reads float4s of its own fragments.
    constexpr int kPart = NT * 32 * kThreads;
    float* ws = a.ws + static_cast<int64_t>(blockIdx.x) * splits * kPart;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        __stcg(reinterpret_cast<float4*>(ws + split * kPart) + (t * 8 + j) * kThreads + tid,
               make_float4(acc[t][4 * j], acc[t][4 * j + 1], acc[t][4 * j + 2], acc[t][4 * j + 3]));
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (tid == 0) {
      last = atomicAdd(a.counters + blockIdx.x, 1u) == static_cast<unsigned>(splits - 1);
      if (last) a.counters[blockIdx.x] = 0;  // for the next launch (it waits for this grid)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The partials (this block's own included, from memory: acc becomes the
    // sum) come into the stages' shared memory a chunk of splits at a time,
    // all of a chunk's copies in flight at once; each thread copies and adds
    // only its own fragments, in split order.
    constexpr int kChunk = C::kStages * C::kStageBytes / (kPart * 4);
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[t][i] = 0.f;
    for (int q0 = 0; q0 < splits; q0 += kChunk) {
      const int nq = min(kChunk, splits - q0);
      for (int qq = 0; qq < nq; ++qq)
#pragma unroll
        for (int c = 0; c < NT * 8; ++c) {
          const int at = (qq * NT * 8 + c) * kThreads + tid;
          CpAsync16At(base + at * 16, ws + (q0 + qq) * kPart + (c * kThreads + tid) * 4, true);
        }
      CpAsyncCommit();
      CpAsyncWait<0>();
      for (int qq = 0; qq < nq; ++qq)
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float4 p =
                reinterpret_cast<const float4*>(part)[(qq * NT * 8 + t * 8 + j) * kThreads + tid];
            acc[t][4 * j] += p.x;
            acc[t][4 * j + 1] += p.y;
            acc[t][4 * j + 2] += p.z;
            acc[t][4 * j + 3] += p.w;
          }
    }
  }
  __syncthreads();  // the stages' memory becomes the output tile

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
  __syncthreads();
  if constexpr (kArgmax) {
    // Two threads per row, each over half of the tile's features; Better
    // makes the result independent of the order.
    const int r = tid >> 1, f0 = (tid & 1) * (C::kTileN / 2);
    float bv = -INFINITY;
    int bi = INT_MAX;
    if (r < M)
      for (int f = f0; f < f0 + C::kTileN / 2; ++f)
        if (n0 + f < N) Better(bv, bi, part[r * PS + f], n0 + f);
    Better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, 1), __shfl_xor_sync(0xffffffffu, bi, 1));
    if ((tid & 1) == 0 && r < M)
      a.best[static_cast<int64_t>(r) * gridDim.x + blockIdx.x] =
          make_float2(bv, __int_as_float(bi));
  }
  if constexpr (kArgmax)
    if (a.store != nullptr && *a.store == 0) return;
  // Stored a row's float4 of features at a time, rows first.
  constexpr int kVecs = kRows * C::kTileN / 4;
  for (int v = tid; v < kVecs; v += kThreads) {
    const int r = v / (C::kTileN / 4), f = (v % (C::kTileN / 4)) * 4;
    if (r >= M || n0 + f >= N) continue;
    float4 s = *reinterpret_cast<const float4*>(part + r * PS + f);
    if (a.act >= 0) {  // features (gate, up) pairs: two outputs
      __nv_bfloat162* yp = reinterpret_cast<__nv_bfloat162*>(
          static_cast<bf16*>(a.y) + static_cast<int64_t>(r) * (N / 2) + (n0 + f) / 2);
      *yp = __floats2bfloat162_rn(Activate(s.x, a.act) * s.y, Activate(s.z, a.act) * s.w);
      continue;
    }
    const int64_t at =
        static_cast<int64_t>(r) * N + n0 + f + (a.planes ? static_cast<int64_t>(split) * M * N : 0);
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
#endif
}

template <int NT, int S, int A, bool kArgmax = false>
cudaError_t LaunchNt(const WgmmaArgs& a, int splits, LaunchConfig launch) {
  using C = Cfg<NT, S, A>;
  if (a.K % C::kBK != 0 || a.K / C::kBK < splits) return cudaErrorInvalidValue;
  static PerDeviceOnce raised;  // (per device: the attribute is the context's)
  {
    const cudaError_t e = raised.Run([] {
      return cudaFuncSetAttribute(WgmmaGemmKernel<NT, S, A, kArgmax>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int{C::kSmem});
    });
    if (e != cudaSuccess) return e;
  }
  return LaunchPdl(WgmmaGemmKernel<NT, S, A, kArgmax>,
                   dim3((a.N + C::kTileN - 1) / C::kTileN, splits), dim3(kThreads), C::kSmem,
                   launch, a);
}

// The instantiation for a plan (tile and stage size).
template <bool kArgmax = false>
cudaError_t Launch(const WgmmaArgs& a, WgmmaGemmPlan plan, LaunchConfig launch) {
  if (plan.tile == 128)
    return plan.k128 ? LaunchNt<2, 4, 2, kArgmax>(a, plan.splits, launch)
                     : LaunchNt<2, 5, 1, kArgmax>(a, plan.splits, launch);
  return plan.k128 ? LaunchNt<1, 3, 2, kArgmax>(a, plan.splits, launch)
                   : LaunchNt<1, 6, 1, kArgmax>(a, plan.splits, launch);
}

}  // namespace

size_t WgmmaGemmWorkspaceBytes(int num_sms) {
  const size_t tiles = static_cast<size_t>(kWsTilesPerSm) * num_sms;
  return tiles * kSubFloats * sizeof(float) + tiles * sizeof(unsigned);
}

cudaError_t LaunchWgmmaGemm(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n,
                            int k, float beta, WgmmaGemmWorkspace ws, LaunchConfig launch, int act,
                            bool planes, WgmmaGemmPlan plan) {
  if (!WgmmaGemmSupported(m, n, k) || ws.num_sms <= 0) return cudaErrorInvalidValue;
  if (plan.tile == 0) plan = WgmmaGemmPlanFor(n, k, ws.num_sms);
  if ((plan.tile != 64 && plan.tile != 128) || n % plan.tile != 0 || plan.splits < 1 ||
      plan.splits > kMaxSplits)
    return cudaErrorInvalidValue;
  if (act >= 0 && (y_f32 || beta != 0.f || planes)) return cudaErrorInvalidValue;
  if (planes && (!y_f32 || beta != 0.f)) return cudaErrorInvalidValue;
  const int room = kWsTilesPerSm * ws.num_sms;
  if (plan.splits > 1 && !planes &&
      (ws.base == nullptr || (n / 64) * plan.splits > room || n / plan.tile > room))
    return cudaErrorInvalidValue;
  WgmmaArgs a;
  static_cast<GemmArgs&>(a) = {
      reinterpret_cast<const bf16*>(x), reinterpret_cast<const bf16*>(w), y, m, n, k, beta, y_f32};
  a.ws = static_cast<float*>(ws.base);
  a.counters = reinterpret_cast<unsigned*>(static_cast<float*>(ws.base) +
                                           static_cast<size_t>(room) * kSubFloats);
  a.act = act;
  a.planes = planes;
  return Launch(a, plan, launch);
}

size_t WgmmaArgmaxScratchBytes(int m, int n, WgmmaGemmPlan plan) {
  const int tile = plan.tile == 0 ? 64 : plan.tile;
  return static_cast<size_t>(m) * ((n + tile - 1) / tile) * sizeof(float2);
}

cudaError_t LaunchWgmmaGemmArgmax(const bf16_t* x, const bf16_t* w, float* y,
                                  const int32_t* store_logits, int m, int n, int k, void* scratch,
                                  int32_t* argmax, int num_sms, LaunchConfig launch,
                                  WgmmaGemmPlan plan) {
  if (!WgmmaGemmSupported(m, n, k) || num_sms <= 0 || scratch == nullptr || argmax == nullptr)
    return cudaErrorInvalidValue;
  if (plan.tile == 0) {
    plan = WgmmaGemmPlanFor(n, k, num_sms);
    plan.splits = 1;
  }
  if ((plan.tile != 64 && plan.tile != 128) || n % plan.tile != 0 || plan.splits != 1)
    return cudaErrorInvalidValue;
  WgmmaArgs a;
  static_cast<GemmArgs&>(a) = {
      reinterpret_cast<const bf16*>(x), reinterpret_cast<const bf16*>(w), y, m, n, k, 0.f, true};
  a.best = static_cast<float2*>(scratch);
  a.store = store_logits;
  const cudaError_t e = Launch<true>(a, plan, launch);
  if (e != cudaSuccess) return e;
  return LaunchArgmaxOfParts(scratch, m, n / plan.tile, argmax, launch);
}

}  // namespace agentkv::backend::cuda::kernels
