// Paged attention for prompt steps (wide tiles) on the warpgroup MMA,
// head_dim 64: the same tiles, masks and online softmax as the mma.sync
// kernel (flash_attention.cu), with Q K^T and P V as wgmma instead of
// ldmatrix + mma.sync. That kernel is bound by instruction issue (its time
// followed its instruction count, bench/RESULTS.md item 63), and per 64-key
// stage each warp spent 64 mma.sync and 32 ldmatrix of its ~300
// instructions on the two products; here the warpgroup issues 8 wgmma a
// stage and reads K and V from shared memory once, not once per warp.
//
// One warpgroup (4 warps, 128 threads) per tile of 64 query rows (the G
// heads of consecutive tokens sharing one KV head); warp w owns rows
// 16 w .. 16 w + 15, which is both the m16n8 and the m64nN fragment layout,
// so Q (loaded once with ldmatrix) and P (packed from the scores) are the
// register A operands of wgmma as they stand. K and V stages of 64 keys are
// copied in with cp.async as rows of 128 bytes, 128-byte swizzled: K is the
// K-major B of S = Q K^T, V the N-major (transposed) B of O = P V, both
// described by the same descriptor form.
//
// Built for sm_90a only; LaunchMmaAttention calls it on compute capability
// 9.0 (AttentionParams::wgmma false: never).
#include <cuda.h>
#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/attention_softmax.cuh"
#include "engine/backend/cuda/kernels/hopper.cuh"
#include "engine/backend/cuda/kernels/mma.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kD = 64;         // head_dim: one 128-byte row per key
constexpr int kStage = 64;     // keys per stage
constexpr int kDP = kD + 8;    // Q rows (ldmatrix, conflict-free)
constexpr int kQBytes = 64 * kDP * 2;
constexpr int kStageBytes = kStage * kD * 2;  // 8 KiB: one K or V stage
// Q, alignment slack, two stages of K, then two of V, then (TMA path) the
// two stages' mbarriers.
constexpr size_t kSmem = kQBytes + 1024 + 4 * kStageBytes + 16;

// A 128-byte swizzled operand of 8-row groups 1024 bytes apart at saddr
// (within a 1024-byte aligned tile): K-major for B of Q K^T (rows are keys,
// the k16 steps 32 bytes apart within the rows) and, read transposed, for
// B of P V (rows are keys along K, the k16 steps 2,048 bytes apart). The
// leading-dimension offset, unused by K-major swizzled operands and by an
// N-major one of a single 64-element atom, is set to the 8-row stride too.
__device__ __forceinline__ uint64_t Desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (uint64_t{1024 >> 4} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// The 32 accumulator operands of an m64n64 wgmma, fragments [8][4].
#define AGENTKV_WGMMA_D(c, d)                                                                     \
  c(d[0][0]), c(d[0][1]), c(d[0][2]), c(d[0][3]), c(d[1][0]), c(d[1][1]), c(d[1][2]), c(d[1][3]), \
      c(d[2][0]), c(d[2][1]), c(d[2][2]), c(d[2][3]), c(d[3][0]), c(d[3][1]), c(d[3][2]),         \
      c(d[3][3]), c(d[4][0]), c(d[4][1]), c(d[4][2]), c(d[4][3]), c(d[5][0]), c(d[5][1]),         \
      c(d[5][2]), c(d[5][3]), c(d[6][0]), c(d[6][1]), c(d[6][2]), c(d[6][3]), c(d[7][0]),         \
      c(d[7][1]), c(d[7][2]), c(d[7][3])
#define AGENTKV_WGMMA_RS                                                              \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "{%32, %33, %34, %35}, %36, "

// d (64 x 64 fp32) = a (register A operand) . B, or d += a . B with kAcc.
template <bool kAcc, int kTransB>
__device__ __forceinline__ void WgmmaRS(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kAcc) {
    asm volatile(AGENTKV_WGMMA_RS "1, 1, 1, %37;\n"
                 : AGENTKV_WGMMA_D("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
  } else {
    asm volatile(AGENTKV_WGMMA_RS "0, 1, 1, %37;\n"
                 : AGENTKV_WGMMA_D("=f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTransB));
  }
#endif
}
#undef AGENTKV_WGMMA_RS
#undef AGENTKV_WGMMA_D

// Pins registers a batch of wgmma reads (before the fence) or that are in
// flight (after the wait): the compiler sees accumulators written and A
// operands read when a wgmma is issued, not when it completes, so without
// these it could move an accumulator's use above the wait, a write below
// the fence, or reuse an A operand's register while a wgmma still reads it.
__device__ __forceinline__ void Pin(float (&d)[8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int NA>
__device__ __forceinline__ void Pin(uint32_t (&a)[NA][4]) {
#pragma unroll
  for (int i = 0; i < NA; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommitWait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// The page copies of the TMA path (kTma): one thread requests a stage's K
// and V pages, 2 * 64 / block_size bulk tensor copies, and every thread
// waits on the stage's mbarrier. The per-row cp.async form had each thread
// look up its rows' pages and build their addresses, ~20% of the kernel's
// instructions (ncu source counters, an 8,192-token prompt step).
// Box {head_dim, 1, block_size, 1, 1} of the group's 5-d map (see
// EncodeKvTensorMap) at page `blk`, K/V plane `plane`, head `kvh`.
__device__ __forceinline__ void TmaPage(uint32_t dst, const void* map, int kvh, int plane, int blk,
                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(map), "r"(0), "r"(kvh), "r"(0), "r"(plane), "r"(blk), "r"(bar)
      : "memory");
}

template <bool kTma>
__global__ void __launch_bounds__(kThreads, 4) WgmmaWideAttentionKernel(const AttentionParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Before PdlWait this kernel reads only the step metadata and cache rows
  // of earlier steps, and writes nothing (as the mma.sync kernel).
  PdlLaunchDependents();
  constexpr int NS = kStage / 8, NO = kD / 8, KQ = kD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  const uint32_t raw = SmemAddr(smem);
  const uint32_t kv = (raw + kQBytes + 1023) & ~1023u;  // the swizzle atoms: 1024-aligned
  bf16* Ks = reinterpret_cast<bf16*>(smem + (kv - raw));
  bf16* Vs = Ks + 2 * kStage * kD;
  const uint32_t ks_addr = kv, vs_addr = kv + 2 * kStageBytes;
  const uint32_t bars = kv + 4 * kStageBytes;  // kTma: one mbarrier a stage buffer

  const int kvh = blockIdx.x, tile = blockIdx.y, split = blockIdx.z;
  const int n = p.tile_n[tile];
  if (n <= 0) {
    PdlWait();  // every block waits: the kernel ends after the one before it
    return;
  }
  const TileSpan ts = SpanOf(p, tile, n, split);
  const int G = p.nh / p.nkv;
  const int tpt = DivG(64, G);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q4 = lane & 3;
  const QueryRows qr = TileRows(p, warp, g, ts.t0, n, tpt, kvh, G);
  if (ts.kb >= ts.ke) {
    PdlWait();
    StoreEmptySplit<kD>(p, qr, split, q4);
    return;
  }

  // kTma: the host gave the map only for block sizes 8 and 16 and no
  // window, so every stage starts on a page (kb is a multiple of 16).
  const int bs = p.cache.block_size, lbs = __ffs(bs) - 1;
  const int32_t* table = p.cache.tables + static_cast<int64_t>(ts.s) * *p.cache.table_stride;
  uint32_t parity = 0;  // kTma: bit b, the phase stage buffer b waits for next
  // Requests the stage of keys from kt into buffer b: kTma, thread 0's page
  // copies (pages past ke not requested); else every thread's cp.async rows.
  KvLoader ld(p, ts.s, kvh, ts.start, ts.first, ts.ke, kD);
  // kTma: thread 0 holds the page ids of the stage it requests next,
  // read one stage ahead: read when needed, the block table's round trip
  // held warp 0 at every stage while the other warps waited for it at the
  // barrier (16% of the kernel's stall samples).
  int ids[kStage / 8];
  auto pages = [&](int kt) { return (min(kStage, ts.ke - kt) + bs - 1) >> lbs; };
  auto read_ids = [&](int kt) {
    const int np = kt < ts.ke ? pages(kt) : 0;
    const int32_t* tb = table + (kt >> lbs);
#pragma unroll
    for (int i = 0; i < kStage / 8; ++i) ids[i] = i < np ? tb[i] : 0;
  };
  if (kTma && tid == 0) read_ids(ts.kb);
  auto issue = [&](int kt, int b) {
    if constexpr (kTma) {
      if (tid != 0) return;
      const int np = pages(kt);
      MbarExpectTx(bars + 8 * b, static_cast<uint32_t>(np * bs * kD * 2 * 2));
      int blk[kStage / 8];
#pragma unroll
      for (int i = 0; i < kStage / 8; ++i) blk[i] = ids[i];
      read_ids(kt + kStage);
#pragma unroll
      for (int i = 0; i < kStage / 8; ++i) {
        if (i >= np) break;
        const uint32_t off = b * kStageBytes + i * bs * kD * 2;
        TmaPage(ks_addr + off, p.kv_map, kvh, p.kv_map_layer, blk[i], bars + 8 * b);
        TmaPage(vs_addr + off, p.kv_map, kvh, p.kv_map_layer + 1, blk[i], bars + 8 * b);
      }
    } else {
      ld.IssueFixed<kD, kStage, kThreads, true>(kt, Ks + b * kStage * kD, Vs + b * kStage * kD, kD,
                                                tid);
    }
  };
  if constexpr (kTma) {
    if (tid == 0) {
      MbarInit(bars);
      MbarInit(bars + 8);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
  }
  const bool early = min(ts.kb + kStage, ts.ke) <= ts.start;
  if (early) issue(ts.kb, 0);
  PdlWait();
  if (!early) issue(ts.kb, 0);
  // Waited for with the first stage (the loop's first wait leaves only the
  // second stage's group in flight; kTma: the only group).
  LoadQueryTileAsync<kD>(p, ts.t0, n, tpt, kvh, G, 64, kDP, Qs, tid, kThreads);
  // This lane's ldmatrix row of Q. Its fragments are loaded again for every
  // stage: loaded once before the loop, they were live across it, yet the
  // SASS put P's fragments in their registers (the scores of every stage
  // after the first came out wrong; bench/RESULTS.md item 65).
  const bf16* qbase = Qs + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kDP + 8 * (lane >> 4);

  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const bool plain = p.window == 0 && !(p.softcap > 0.f);
  int buf = 0;
  for (int kt = ts.kb; kt < ts.ke; kt += kStage) {
    const bool more = kt + kStage < ts.ke;
    if (more) issue(kt + kStage, buf ^ 1);
    if constexpr (kTma) {
      CpAsyncWait<0>();  // the query tile (first stage; nothing later)
      MbarWait(bars + 8 * buf, (parity >> buf) & 1);
      parity ^= 1u << buf;
      if (!more && kt + kStage > ts.ke) {
        // The last stage's V rows from ke on: pages not requested hold
        // what an earlier stage or block left (P is 0 there, but 0 * NaN is
        // not); K's are masked by select and need nothing.
        for (int i = (ts.ke - kt) * (kD / 8) + tid; i < kStage * (kD / 8); i += kThreads)
          reinterpret_cast<uint4*>(Vs + buf * kStage * kD)[i] = make_uint4(0, 0, 0, 0);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      }
    } else {
      if (more) {
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      // cp.async wrote through the generic proxy; wgmma reads through the
      // async one.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    const uint32_t kaddr = ks_addr + buf * kStageBytes, vaddr = vs_addr + buf * kStageBytes;
    float sc[NS][4];
    uint32_t qf[KQ][4];
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) Ldsm4(qf[kk], qbase + kk * 16);
    Pin(qf);
    WgmmaFence();
    WgmmaRS<false, 0>(sc, qf[0], Desc(kaddr));
#pragma unroll
    for (int kk = 1; kk < KQ; ++kk) WgmmaRS<true, 0>(sc, qf[kk], Desc(kaddr + kk * 32));
    WgmmaCommitWait();
    Pin(sc);
    Pin(qf);
    SoftmaxStage<NS, NO>(sc, o, m, l, plain && kt + kStage <= ts.ke && kt + kStage <= ts.p0 + 1, p,
                         qr, kt, ts.ke, q4);
    // O += P V, 16 keys at a time: the score fragments of keys
    // [16c, 16c + 16) are the A fragment as they stand.
    uint32_t pa[NS / 2][4];
#pragma unroll
    for (int c = 0; c < NS / 2; ++c) {
      pa[c][0] = PackBf16(sc[2 * c][0], sc[2 * c][1]);
      pa[c][1] = PackBf16(sc[2 * c][2], sc[2 * c][3]);
      pa[c][2] = PackBf16(sc[2 * c + 1][0], sc[2 * c + 1][1]);
      pa[c][3] = PackBf16(sc[2 * c + 1][2], sc[2 * c + 1][3]);
    }
    Pin(o);
    Pin(pa);
    WgmmaFence();
#pragma unroll
    for (int c = 0; c < NS / 2; ++c) WgmmaRS<true, 1>(o, pa[c], Desc(vaddr + c * 16 * kD * 2));
    WgmmaCommitWait();
    Pin(o);
    Pin(pa);
    __syncthreads();  // every warp is done with `buf` before it is refilled
    buf ^= 1;
  }
  StoreRows<kD, NO>(p, qr, o, m, l, split, q4);
#endif
}

}  // namespace

bool WgmmaAttentionSupported(int head_dim) {
  // The device's compute capability, asked once.
  static const bool sm90 = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      return false;
    return major == 9 && minor == 0;
  }();
  return sm90 && head_dim == kD;
}

bool EncodeKvTensorMap(const bf16_t* base, int64_t blocks, int64_t block_stride, int layers,
                       int block_size, int nkv, int head_dim, void* map) {
  if (!WgmmaAttentionSupported(head_dim) || (block_size != 8 && block_size != 16) || blocks <= 0 ||
      layers <= 0 || base == nullptr)
    return false;
  const TensorMapEncoder encode = TensorMapEncode();
  if (encode == nullptr) return false;
  // Innermost first: head_dim elements, the KV head, the row in the block,
  // the layer's K or V plane (2 * layer + 0 / 1: a layer's V follows its K
  // as the next layer's K follows its V), the block.
  const uint64_t e = sizeof(bf16_t);
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(nkv),
                              static_cast<cuuint64_t>(block_size),
                              static_cast<cuuint64_t>(2 * layers), static_cast<cuuint64_t>(blocks)};
  const cuuint64_t strides[4] = {head_dim * e, static_cast<uint64_t>(nkv) * head_dim * e,
                                 static_cast<uint64_t>(block_size) * nkv * head_dim * e,
                                 static_cast<uint64_t>(block_stride) * e};
  const cuuint32_t box[5] = {static_cast<cuuint32_t>(head_dim), 1,
                             static_cast<cuuint32_t>(block_size), 1, 1};
  const cuuint32_t step[5] = {1, 1, 1, 1, 1};
  static_assert(sizeof(CUtensorMap) == kKvTensorMapBytes, "descriptor size");
  return encode(static_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5,
                const_cast<bf16_t*>(base), dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool AttentionReadsCacheOnly(const AttentionParams& p) {
  return p.wide && p.wgmma && p.kv_map != nullptr && WgmmaAttentionSupported(p.head_dim) &&
         p.nkv > 0 && p.nh / p.nkv <= 64 && p.window == 0 && p.cache.ring == 0 &&
         (p.cache.block_size == 8 || p.cache.block_size == 16);
}

cudaError_t LaunchWgmmaWideAttention(const AttentionParams& p, LaunchConfig launch) {
  if (!p.wide || p.head_dim != kD || p.nh / p.nkv > 64) return cudaErrorInvalidValue;
  if (p.num_tiles > 65535) return cudaErrorInvalidConfiguration;  // grid y
  const dim3 grid(p.nkv, p.num_tiles, p.splits);
  if (AttentionReadsCacheOnly(p))
    return LaunchPdl(WgmmaWideAttentionKernel<true>, grid, dim3(kThreads), kSmem, launch, p);
  if (p.k_new == nullptr || p.v_new == nullptr) return cudaErrorInvalidValue;
  return LaunchPdl(WgmmaWideAttentionKernel<false>, grid, dim3(kThreads), kSmem, launch, p);
}

}  // namespace agentkv::backend::cuda::kernels
