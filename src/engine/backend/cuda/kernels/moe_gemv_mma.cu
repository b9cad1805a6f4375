// The grouped GEMM's weight-streaming form for quantized weights (fp8
// block, mxfp4; LaunchMoeGemv sends them here): each selected expert's
// weights read once per pass of up to 16 rows of its group, dequantized in
// registers into the A fragments of mma.sync m16n8k16 (f16 in, fp32
// accumulators), the group's rows (tokens) as B from shared memory. On the
// CUDA cores the conversions and scale lookups of each weight took the
// whole issue budget of the bytes' arrival (bench/RESULTS.md, "Quantized
// decode GEMV on the tensor cores"); here a weight value costs about half
// an instruction (fp8) or one and a half (mxfp4) before the MMA.
//
// Layout. A warp owns a 16-row tile of weights (rows n0 + g and n0 + g + 8
// for lane 4g + t) and walks its rows in 64-byte chunks: lane t loads bytes
// [64c + 16t, +16) of both its rows. A 4x4 transpose of 32-bit words among
// the 4 lanes of a row (Transpose4) leaves lane t with word t of each
// lane's 16 bytes, so mma step b of the chunk takes its 16 columns from the
// 16 bytes lane b loaded: one fp8 scale block (block_cols a multiple of 16)
// or half an mxfp4 block. The A fragment's k slots (2t, 2t + 1, 2t + 8,
// 2t + 9) are the lane's four values of the step, in an order the staged x
// repeats, so each B fragment is one 8-byte shared-memory load:
//   fp8: word bytes k..k+3 -> slots (k, k+1 | k+2, k+3); x as stored.
//   mxfp4: a word holds values v..v+7 of a block (nibbles, low first);
//     step 0 takes v+0..3 as slots (v, v+2 | v+1, v+3), step 1 v+4..7
//     likewise; x staged so that the 4 values of (step s, lane t) sit
//     together in that order (moe_gemv_layout.h, tested on the host).
// Dequantization: fp8 by cvt.rn.f16x2.e4m3x2 (exact); mxfp4 by rewriting
// each e2m1 nibble as the e4m3 byte of its value times 2^-6 (sign to bit 7,
// exponent and mantissa to bits 4..2: exact, subnormal 0.5 included), then
// the same conversion. Scales multiply the mma's partial sums in fp32: fp8
// once per chunk (or per step where blocks are narrower than 64 columns),
// mxfp4 once per 32-value block (times the 2^6).
// x: bf16 rows turned into f16 scaled by 2^s per row (s from the row's
// largest magnitude, so that it stays below 2^15 and every bf16 value of
// the row down to 2^-29 of the largest converts exactly); outputs are
// multiplied by 2^-s.
// Split: MoeGemvMmaSplit warps of a block share a tile, each taking every
// split-th chunk; their sums meet in shared memory before the epilogue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "engine/backend/cuda/kernels/activation.cuh"
#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/kernels/moe_gemv_layout.h"
#include "engine/backend/cuda/kernels/moe_gemv_mma.h"
#include "engine/backend/cuda/kernels/moe_plan.h"
#include "engine/backend/cuda/kernels/moe_quant.cuh"
#include "engine/backend/cuda/kernels/moe_tile.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSlots = 4;        // chunks in flight per warp (2 x 16-byte loads per lane each)
constexpr int kChunkBytes = 64;  // of a weight row, per warp step
constexpr unsigned kFull = 0xffffffffu;

// Values of a weight row in one chunk, and the staged x row padding.
template <MoeWeightFormat F>
constexpr int ChunkValues() {
  return F == MoeWeightFormat::kFp8Block ? 64 : 128;
}

// x row stride (f16 elements) for rows of K: K rounded up to whole chunks
// (zeros past K), plus 16 so that the 8-byte B loads of a half warp (4 rows
// x 4 lanes) fall on distinct banks.
template <MoeWeightFormat F>
__host__ __device__ inline int XStride(int K) {
  return (K + ChunkValues<F>() - 1) / ChunkValues<F>() * ChunkValues<F>() + 16;
}

// Where value k of a row sits in the staged row: fp8 as stored; mxfp4 as
// moe_gemv_layout.h says.
template <MoeWeightFormat F>
__device__ __forceinline__ int StagePos(int k) {
  if constexpr (F == MoeWeightFormat::kFp8Block) {
    return k;
  } else {
    return MoeMxfp4StagePos(k);
  }
}

__device__ __forceinline__ uint32_t F16x2FromE4m3x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// d += a (16x16 f16, row) * b (16x8 f16, col), fp32 accumulators.
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// Lane t of each 4-lane group ends with w[b] = word t of lane b's w: two
// exchange rounds (lane bit 0, then bit 1), each swapping the two words
// whose index differs from the lane in that bit.
__device__ __forceinline__ void Transpose4(uint32_t (&w)[4], int t) {
  const bool odd = (t & 1) != 0, high = (t & 2) != 0;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t v = __shfl_xor_sync(kFull, odd ? w[2 * k] : w[2 * k + 1], 1);
    if (odd)
      w[2 * k] = v;
    else
      w[2 * k + 1] = v;
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t v = __shfl_xor_sync(kFull, high ? w[k] : w[k + 2], 2);
    if (high)
      w[k] = v;
    else
      w[k + 2] = v;
  }
}

using Tile = MoeTile;

// a / b for 0 <= a < 2^20, b > 0, from inv_b = 1 / b (rounded): the
// float quotient is within one of the true one; the integer checks fix it.
// (A runtime integer division is ~20 instructions; this one is in the
// per-chunk path.)
__device__ __forceinline__ int FloorDiv(int a, int b, float inv_b) {
  int q = __float2int_rz(static_cast<float>(a) * inv_b);
  if (q * b > a) --q;
  if ((q + 1) * b <= a) ++q;
  return q;
}

// What a lane keeps of one in-flight chunk: its two 16-byte loads and
// their scale data (fp8: the chunk's scales for rows g and g + 8 when one
// scale covers the chunk; mxfp4: the exponents of its own blocks, row g in
// bits 0..7 and row g + 8 in bits 8..15).
struct Slot {
  uint4 w[2];
  float s[2];
  uint32_t e;
};

// The per-lane constants of a warp's tile.
struct Lane {
  int lane, g, t;
  int n[2];              // weight rows g and g + 8 (may be past N)
  const uint8_t* w[2];   // their bytes (null past N)
  int64_t sbase[2];      // fp8: their scale rows' first index
  const uint8_t* ex[2];  // mxfp4: their exponents (null past N)
  float inv_bc;          // fp8: 1 / block_cols
};

template <MoeWeightFormat F, bool kStepScale>
__device__ __forceinline__ void LoadSlot(const MoeGemmParams& p, const Lane& l, int row_bytes,
                                         int c, Slot& s) {
  const int off = c * kChunkBytes + 16 * l.t;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const bool in = l.w[q] != nullptr && off < row_bytes;
    s.w[q] = in ? __ldg(reinterpret_cast<const uint4*>(l.w[q] + off)) : make_uint4(0u, 0u, 0u, 0u);
  }
  if constexpr (F == MoeWeightFormat::kFp8Block) {
    if constexpr (!kStepScale) {
      const int kb = FloorDiv(c * kChunkBytes, p.block_cols, l.inv_bc);
#pragma unroll
      for (int q = 0; q < 2; ++q)
        s.s[q] = l.w[q] != nullptr ? __ldg(p.scales + l.sbase[q] + kb) : 0.f;
    }
  } else {
    const int blk = 4 * c + l.t, nb = p.K / 32;
    uint32_t e = 0;
#pragma unroll
    for (int q = 0; q < 2; ++q)
      if (l.ex[q] != nullptr && blk < nb)
        e |= static_cast<uint32_t>(__ldg(l.ex[q] + blk)) << (8 * q);
    s.e = e;
  }
}

// B fragment of token tile nt at staged position pos (the lane's 4
// values): zeros for tokens past the pass's staged rows.
__device__ __forceinline__ uint2 LoadB(const uint16_t* xs, int ld, int rows, int tok, int pos) {
  if (tok >= rows) return make_uint2(0u, 0u);
  return *reinterpret_cast<const uint2*>(xs + tok * ld + pos);
}

// acc[nt] += the chunk's products (rows g, g + 8 x tokens 2t, 2t + 1 of
// token tile nt), scaled; `rows` tokens staged (token tiles past them
// skipped).
template <MoeWeightFormat F, int NT, bool kStepScale>
__device__ __forceinline__ void Chunk(const MoeGemmParams& p, const Lane& l, const Slot& s, int c,
                                      const uint16_t* xs, int ld, int rows, float (&acc)[NT][4]) {
  uint32_t wg[4] = {s.w[0].x, s.w[0].y, s.w[0].z, s.w[0].w};
  uint32_t wh[4] = {s.w[1].x, s.w[1].y, s.w[1].z, s.w[1].w};
  Transpose4(wg, l.t);
  Transpose4(wh, l.t);
  if constexpr (F == MoeWeightFormat::kFp8Block) {
    float tmp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) tmp[nt][i] = 0.f;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int k0 = c * 64 + 16 * b;
      if (k0 >= p.K) break;  // (the whole warp: past the row's end)
      const uint32_t a[4] = {F16x2FromE4m3x2(wg[b]), F16x2FromE4m3x2(wh[b]),
                             F16x2FromE4m3x2(wg[b] >> 16), F16x2FromE4m3x2(wh[b] >> 16)};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        if (nt * 8 < rows) MmaF16(tmp[nt], a, LoadB(xs, ld, rows, nt * 8 + l.g, k0 + 4 * l.t));
      if constexpr (kStepScale) {
        // Blocks narrower than the chunk: this step's own scales.
        const int kb = FloorDiv(k0, p.block_cols, l.inv_bc);
        float sc[2];
#pragma unroll
        for (int q = 0; q < 2; ++q)
          sc[q] = l.w[q] != nullptr ? __ldg(p.scales + l.sbase[q] + kb) : 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[nt][i] = fmaf(tmp[nt][i], sc[i / 2], acc[nt][i]);
            tmp[nt][i] = 0.f;
          }
      }
    }
    if constexpr (!kStepScale) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = fmaf(tmp[nt][i], s.s[i / 2], acc[nt][i]);
    }
  } else {
    const int nb = p.K / 32;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int blk = 4 * c + b;
      if (blk >= nb) break;  // (the whole warp)
      // Block b's exponents (rows g, g + 8) from lane b of the group.
      const uint32_t eb = __shfl_sync(kFull, s.e, (l.lane & ~3) | b);
      // Step s's A fragment: e4m3 pairs of rows g and g + 8 for slots
      // (2t, 2t + 1), then (2t + 8, 2t + 9) (moe_gemv_layout.h).
      uint32_t a[2][4];
#pragma unroll
      for (int st = 0; st < 2; ++st) {
        uint32_t pg[2], ph[2];
        MoeMxfp4StepPairs(wg[b], st, pg);
        MoeMxfp4StepPairs(wh[b], st, ph);
        a[st][0] = F16x2FromE4m3x2(pg[0]);
        a[st][1] = F16x2FromE4m3x2(ph[0]);
        a[st][2] = F16x2FromE4m3x2(pg[1]);
        a[st][3] = F16x2FromE4m3x2(ph[1]);
      }
      const float sc[2] = {moeq::E8m0(eb & 0xffu), moeq::E8m0((eb >> 8) & 0xffu)};
      const int pos = blk * 32 + 4 * l.t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt * 8 >= rows) continue;  // (the whole warp)
        float tmp[4] = {0.f, 0.f, 0.f, 0.f};
        MmaF16(tmp, a[0], LoadB(xs, ld, rows, nt * 8 + l.g, pos));
        MmaF16(tmp, a[1], LoadB(xs, ld, rows, nt * 8 + l.g, pos + 16));
        // (2^6 first: the nibbles were rebuilt as value x 2^-6, and no
        // product of the two factors may overflow where the value does not.)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = fmaf(tmp[i] * 64.f, sc[i / 2], acc[nt][i]);
      }
    }
  }
}

// Rows [c0, c0 + rows) of the tile (rows <= kMaxMoeGemvMmaRows, all in
// the tile) into xs as scaled f16 (zeros past K), and each row's output
// factor 2^-s into xinv (amax: a word of scratch per row). kThreads / P2
// threads share a row (P2 the power of two that holds `rows`) for its
// largest magnitude and its conversion. Ends with the block synchronised.
template <MoeWeightFormat F>
__device__ __forceinline__ void StageX(const MoeGemmParams& p, const Tile& t, int c0, int rows,
                                       uint16_t* xs, int ld, float* xinv, uint32_t* amax) {
  const int kv = (ld - 16) / 8;  // 8-value groups of a staged row
  if (threadIdx.x < rows) amax[threadIdx.x] = 0u;
  for (int i = threadIdx.x; i < rows * kv; i += blockDim.x) {
    const int r = i / kv, k = (i % kv) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (c0 + r < t.rows && k < p.K) {
      const int g = t.row0 + c0 + r;
      const int64_t src = p.order != nullptr ? p.order[g] / p.div : g;
      v = *reinterpret_cast<const uint4*>(p.x + src * p.K + k);
    }
    uint16_t* row = xs + r * ld;
    if constexpr (F == MoeWeightFormat::kFp8Block) {
      *reinterpret_cast<uint4*>(row + k) = v;
    } else {
      // Values k..k+7 (k = 8t within a block): (0, 2, 1, 3) at 4t, (4, 6,
      // 5, 7) at 16 + 4t (StagePos).
      const int at = StagePos<F>(k);
      *reinterpret_cast<uint2*>(row + at) =
          make_uint2(__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.x, v.y, 0x7632));
      *reinterpret_cast<uint2*>(row + at + 16) =
          make_uint2(__byte_perm(v.z, v.w, 0x5410), __byte_perm(v.z, v.w, 0x7632));
    }
  }
  __syncthreads();
  int p2 = 1;
  while (p2 < rows) p2 *= 2;
  const int tr = kThreads / p2, r = threadIdx.x / tr, j = threadIdx.x % tr;
  const bool live = r < rows;  // (threads of rows past `rows` only shuffle)
  uint4* row = reinterpret_cast<uint4*>(xs + r * ld);
  // The largest magnitude's float bits (bf16 bits shifted up, sign off).
  uint32_t mx = 0;
  for (int q = j; live && q < kv; q += tr) {
    const uint4 v = row[q];
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) mx = max(mx, max((u[i] << 16) & 0x7fffffffu, u[i] & 0x7fff0000u));
  }
  const int group = min(tr, 32);  // lanes of a warp on one row
  for (int o = group / 2; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(kFull, mx, o));
  if (live && (threadIdx.x & (group - 1)) == 0) atomicMax(amax + r, mx);
  __syncthreads();
  if (live) {
    // |x| < 2^(E - 126) for the largest's biased exponent E: times 2^s
    // with s = 141 - E it stays below 2^15 (f16's largest is ~2^16).
    const int E = static_cast<int>(amax[r] >> 23);
    const int s = min(126, max(-126, 141 - E));
    const float up = __uint_as_float(static_cast<uint32_t>(127 + s) << 23);
    if (j == 0) xinv[r] = __uint_as_float(static_cast<uint32_t>(127 - s) << 23);
    for (int q = j; q < kv; q += tr) {  // in place: each element keeps its position
      const uint4 v = row[q];
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2 h = __floats2half2_rn(__uint_as_float(u[i] << 16) * up,
                                            __uint_as_float(u[i] & 0xffff0000u) * up);
        o[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
      row[q] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
  __syncthreads();
}

// One value of the product (row n, grouped row gr; bias included) through
// the epilogue; gated forms pair lanes 4 apart (rows g even and g + 1).
__device__ __forceinline__ void Store(const MoeGemmParams& p, int n, int64_t gr, bool ok, float v,
                                      bool gated, bool gate_lane) {
  if (gated) {
    const float u = __shfl_down_sync(kFull, v, 4);
    if (!ok || !gate_lane) return;
    const float out = GatedProduct(v, u, MoeEpilogueForm(p.epilogue), p.limit);
    p.act[gr * (p.N / 2) + n / 2] = ToBf(out);
    return;
  }
  if (!ok) return;
  if (p.epilogue == MoeEpilogue::kStoreBf16) {
    p.act[gr * p.N + n] = ToBf(v);
    return;
  }
  float* y = p.y + gr * p.N + n;
  *y = (p.accumulate ? *y : 0.f) + v;
}

template <MoeWeightFormat F, int NT, bool kStepScale>
__global__ void __launch_bounds__(kThreads)
    MoeGemvMmaKernel(const MoeGemmParams p, int split, int P) {
  PdlLaunchDependents();
  extern __shared__ __align__(16) unsigned char smem[];
  const int E = p.offsets != nullptr ? p.num_experts : 0;
  int32_t* tiles_s = reinterpret_cast<int32_t*>(smem);
  int32_t* offsets_s = tiles_s + (E + 1);
  const int ld = XStride<F>(p.K);
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem + (2 * (E + 1) * 4 + 15) / 16 * 16);
  float* xinv = reinterpret_cast<float*>(xs + P * ld);
  uint32_t* amax = reinterpret_cast<uint32_t*>(xinv + kMaxMoeGemvMmaRows);
  float* red = reinterpret_cast<float*>(amax + kMaxMoeGemvMmaRows);  // [kWarps][NT * 4][32]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int part = warp % split;
  const int row_bytes = F == MoeWeightFormat::kFp8Block ? p.K : p.K / 2;
  const int chunks = (row_bytes + kChunkBytes - 1) / kChunkBytes;
  const int mine = chunks > part ? (chunks - part + split - 1) / split : 0;

  // One group: nothing to wait for before the weights; with experts the
  // grouping is the plan kernel's output.
  if (E > 0) PdlWait();
  Tile t;
  if (!FindMoeTile(p, E, blockIdx.y, tiles_s, offsets_s, &t)) return;  // (the whole block)

  Lane l;
  l.lane = lane;
  l.g = lane >> 2;
  l.t = lane & 3;
  l.inv_bc = F == MoeWeightFormat::kFp8Block ? 1.f / static_cast<float>(p.block_cols) : 0.f;
  const int n0 = (blockIdx.x * (kWarps / split) + warp / split) * 16;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int n = n0 + l.g + 8 * q;
    l.n[q] = n;
    const bool in = n < p.N;
    const int64_t row = static_cast<int64_t>(t.e) * p.N + n;
    l.w[q] = in ? p.wq + row * row_bytes : nullptr;
    l.ex[q] = in && F == MoeWeightFormat::kMxfp4 ? p.exps + row * (p.K / 32) : nullptr;
    l.sbase[q] = 0;
    if (F == MoeWeightFormat::kFp8Block && in) {
      const int nkb = (p.K + p.block_cols - 1) / p.block_cols;
      int64_t rb;
      if (p.scale_pairs) {
        const int half_blocks = (p.N / 2 + p.block_rows - 1) / p.block_rows;
        rb = static_cast<int64_t>(t.e) * 2 * half_blocks + (n & 1) * half_blocks +
             (n >> 1) / p.block_rows;
      } else {
        rb = static_cast<int64_t>(t.e) * ((p.N + p.block_rows - 1) / p.block_rows) +
             n / p.block_rows;
      }
      l.sbase[q] = rb * nkb;
    }
  }

  Slot slot[kSlots];
  // The first round of weights goes out before x is gathered (and, for one
  // group, before the kernel that writes x has finished).
#pragma unroll
  for (int u = 0; u < kSlots; ++u)
    if (u < mine) LoadSlot<F, kStepScale>(p, l, row_bytes, part + split * u, slot[u]);
  if (E == 0) PdlWait();

  const bool gated = MoeEpilogueGated(p.epilogue);
  for (int c0 = 0; c0 < t.rows; c0 += P) {
    if (c0 > 0) {
      __syncthreads();  // every warp is done with the last pass's x and sums
#pragma unroll
      for (int u = 0; u < kSlots; ++u)
        if (u < mine) LoadSlot<F, kStepScale>(p, l, row_bytes, part + split * u, slot[u]);
    }
    const int rows = min(P, t.rows - c0);  // this pass's
    StageX<F>(p, t, c0, rows, xs, ld, xinv, amax);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;
    for (int i0 = 0; i0 < mine; i0 += kSlots) {
#pragma unroll
      for (int u = 0; u < kSlots; ++u) {
        const int i = i0 + u;
        if (i < mine) {  // (the whole warp)
          Chunk<F, NT, kStepScale>(p, l, slot[u], part + split * i, xs, ld, rows, acc);
          if (i + kSlots < mine)
            LoadSlot<F, kStepScale>(p, l, row_bytes, part + split * (i + kSlots), slot[u]);
        }
      }
    }
    // The split warps' sums meet in the first one's registers.
    if (split > 1) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[(warp * NT * 4 + nt * 4 + i) * 32 + lane] = acc[nt][i];
      __syncthreads();
      if (part != 0) continue;  // (the next pass starts with a barrier all reach)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          for (int w = 1; w < split; ++w)
            acc[nt][i] += red[((warp + w) * NT * 4 + nt * 4 + i) * 32 + lane];
    }
    // c[nt][i]: row g + 8 (i / 2), token nt * 8 + 2t + (i % 2).
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int q = i / 2, tok = nt * 8 + 2 * l.t + (i % 2), n = l.n[q];
        const bool ok = n < p.N && tok < rows;
        const float b =
            p.bias != nullptr && n < p.N ? p.bias[static_cast<int64_t>(t.e) * p.N + n] : 0.f;
        const float v = acc[nt][i] * xinv[min(tok, rows - 1)] + b;
        Store(p, n, static_cast<int64_t>(t.row0) + c0 + tok, ok, v, gated, (l.g & 1) == 0);
      }
  }
}

int NumSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return n;
  }();
  return sms;
}

template <MoeWeightFormat F, int NT, bool kStepScale>
cudaError_t LaunchFor(const MoeGemmParams& p, int tiles, int P, LaunchConfig launch) {
  const int E = p.offsets != nullptr ? p.num_experts : 0;
  const size_t smem = (static_cast<size_t>(2) * (E + 1) * 4 + 15) / 16 * 16 +
                      static_cast<size_t>(P) * XStride<F>(p.K) * 2 + kMaxMoeGemvMmaRows * 8 +
                      static_cast<size_t>(kWarps) * NT * 4 * 32 * 4;
  auto kernel = MoeGemvMmaKernel<F, NT, kStepScale>;
  if (smem > 48 * 1024) {  // (past 48 KiB must be asked for, per device)
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int row_bytes = F == MoeWeightFormat::kFp8Block ? p.K : p.K / 2;
  const int row_tiles = (p.N + 15) / 16;
  const int split =
      MoeGemvMmaSplit(row_tiles, tiles, (row_bytes + kChunkBytes - 1) / kChunkBytes, NumSms());
  const int tiles_per_block = kWarps / split;
  const dim3 grid((row_tiles + tiles_per_block - 1) / tiles_per_block, tiles);
  return LaunchPdl(kernel, grid, dim3(kThreads), smem, launch, p, split, P);
}

template <MoeWeightFormat F, bool kStepScale>
cudaError_t LaunchRows(const MoeGemmParams& p, int tiles, LaunchConfig launch) {
  const int P = MoeGemvPassRows(p.max_group_rows, F, p.K);
  return P > 8 ? LaunchFor<F, 2, kStepScale>(p, tiles, P, launch)
               : LaunchFor<F, 1, kStepScale>(p, tiles, P, launch);
}

}  // namespace

cudaError_t LaunchMoeGemvMma(const MoeGemmParams& p, int tiles, LaunchConfig launch) {
  if (p.format == MoeWeightFormat::kMxfp4)
    return LaunchRows<MoeWeightFormat::kMxfp4, false>(p, tiles, launch);
  if (p.format != MoeWeightFormat::kFp8Block) return cudaErrorInvalidValue;
  // One scale per 64-column chunk where blocks are whole chunks or a row is
  // one block; else a scale per 16-column mma step.
  const bool chunk_scale =
      p.block_cols % kChunkBytes == 0 || (p.K + p.block_cols - 1) / p.block_cols == 1;
  return chunk_scale ? LaunchRows<MoeWeightFormat::kFp8Block, false>(p, tiles, launch)
                     : LaunchRows<MoeWeightFormat::kFp8Block, true>(p, tiles, launch);
}

}  // namespace agentkv::backend::cuda::kernels
