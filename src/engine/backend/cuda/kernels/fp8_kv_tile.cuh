// Reading the fp8 (e4m3) KV cache (engine/backend/kv_fp8.h's block layout) in the
// attention kernels (device code only): the exact e4m3 -> bf16 widening and
// the tile loader the mma.sync flash kernel (flash_attention.cu) takes
// in place of KvLoader for an fp8 cache.
//
// Why a staging area: cp.async copies bytes, it cannot widen them. A stage's
// e4m3 rows and their f32 scales travel by cp.async (16-byte row chunks,
// several stages in flight like the bf16 tiles), and Convert() then writes the stage
// as bf16 into the tile the tensor-core loop reads with ldmatrix. e4m3
// values are exact in bf16 (4 significant bits, exponents 2^-9..2^8), so the
// tile holds the stored values unscaled; the kernel multiplies each score by
// its key's scale and each softmax weight by its value row's scale.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/cuda/kernels/mma_attention_layout.h"
#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {

// Eight e4m3 bytes (a uint2) -> eight bf16 in a uint4, exactly (e4m3 ->
// f16 in hardware, f16 -> f32 -> bf16 without rounding: every e4m3 value
// is a normal f16 and a bf16).
__device__ __forceinline__ uint32_t E4m3x2ToBf16x2(uint32_t two_bytes) {
  const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xffffu);
  const __half2 h2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
  const float2 f = __half22float2(h2);
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
__device__ __forceinline__ uint4 E4m3x8ToBf16(uint2 in) {
  return make_uint4(E4m3x2ToBf16x2(in.x), E4m3x2ToBf16x2(in.x >> 16), E4m3x2ToBf16x2(in.y),
                    E4m3x2ToBf16x2(in.y >> 16));
}

// cp.async of 4 bytes (a scale); zero-filled when !valid.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

// The loader of an fp8 cache's K/V stages. A stage of kKeys keys at head_dim
// kD is Fp8KvLoader::StageBytes<kD, kKeys>() bytes of shared memory (16-byte
// aligned): K bytes [kKeys][kD], V bytes [kKeys][kD], K scales [kKeys], V
// scales [kKeys] (f32). Keys at positions >= start are this step's
// (AttentionParams::fp8_new, quantized before attention), older ones the
// paged cache's; keys from ke on are zeros with scale 0.
struct Fp8KvLoader {
  static constexpr bool kFp8 = true;
  KvCacheView c;
  const uint8_t* cache;
  Fp8KvRows fresh;
  const uint8_t* dummy;  // a valid address for zero-filled loads
  const int32_t* table;
  int64_t kv_row;     // bytes of a token's K (or V) row in a section: nkv * D
  int64_t section;    // bytes of a K (or V) section of a layer
  int64_t scales_at;  // offset of the scales within a section
  int nkv, kvh, start, first, ke, D;

  template <int kD, int kKeys>
  static constexpr int StageBytes() {
    return static_cast<int>(Fp8StageBytes(kD, kKeys));
  }

  // (No L2 eviction hint, unlike KvLoader's decode loads: CUDA 13.0's
  // ptxas compiled the hinted cp.async of the head_dim 128 decode loop to
  // an LDGSTS form none of the working kernels has, and an H200 stopped on
  // it with an illegal instruction; see docs/kv-fp8.md.)
  __device__ __forceinline__ Fp8KvLoader(const AttentionParams& p, int s, int kvh_, int start_,
                                         int first_, int ke_)
      : c(p.cache),
        cache(reinterpret_cast<const uint8_t*>(p.cache.base)),
        fresh(p.fp8_new),
        dummy(reinterpret_cast<const uint8_t*>(p.q)),
        table(p.cache.tables + static_cast<int64_t>(s) * *p.cache.table_stride),
        kv_row(static_cast<int64_t>(p.nkv) * p.head_dim),
        section(static_cast<int64_t>(p.cache.block_size) * p.nkv * (p.head_dim + 4)),
        scales_at(static_cast<int64_t>(p.cache.block_size) * p.nkv * p.head_dim),
        nkv(p.nkv),
        kvh(kvh_),
        start(start_),
        first(first_),
        ke(ke_),
        D(p.head_dim) {}

  // Key kp's K and V rows and their scales.
  __device__ __forceinline__ void Rows(int kp, const uint8_t*& kr, const uint8_t*& vr,
                                       const float*& ks, const float*& vs) const {
    if (kp >= start) {
      const int64_t r = static_cast<int64_t>(first + kp - start) * nkv + kvh;
      kr = fresh.k + r * D;
      vr = fresh.v + r * D;
      ks = fresh.k_scale + r;
      vs = fresh.v_scale + r;
    } else {
      const int bs = c.block_size;
      const int lb = (bs & (bs - 1)) == 0 ? kp >> (__ffs(bs) - 1) : kp / bs;
      const int in = kp - lb * bs;
      const int64_t blk = table[c.ring > 0 ? lb % c.ring : lb];
      const uint8_t* sec = cache + blk * c.block_stride + c.layer_offset;
      kr = sec + in * kv_row + kvh * D;
      vr = kr + section;
      ks = reinterpret_cast<const float*>(sec + scales_at) + static_cast<int64_t>(in) * nkv + kvh;
      vs = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(ks) + section);
    }
  }

  // Key kp's row (zeros from ke on) into row j of `stage` (kKeys rows): this
  // thread's 16-byte column col, and with col 0 the two scales, or
  // (kSplitScales) with col 0 the key's and with col 1 the value's: one
  // 4-byte copy a thread at most, where col 0 issued both (each scale is a
  // 32-byte sector of its own, 4 bytes of it this head's).
  template <int kD, int kKeys, bool kSplitScales = false>
  __device__ __forceinline__ void CopyRow(int kp, int j, int col, uint8_t* stage) const {
    uint8_t* kd = stage;
    uint8_t* vd = stage + kKeys * kD;
    float* ksd = reinterpret_cast<float*>(stage + Fp8KeyScalesAt(kD, kKeys));
    float* vsd = reinterpret_cast<float*>(stage + Fp8ValueScalesAt(kD, kKeys));
    const bool valid = kp < ke;
    const uint8_t* kr = dummy;
    const uint8_t* vr = dummy;
    const float* ks = reinterpret_cast<const float*>(dummy);
    const float* vs = ks;
    if (valid) {
      Rows(kp, kr, vr, ks, vs);
      kr += col * 16;
      vr += col * 16;
    }
    CpAsync16(kd + j * kD + col * 16, kr, valid);
    CpAsync16(vd + j * kD + col * 16, vr, valid);
    if constexpr (kSplitScales) {
      static_assert(kD / 16 >= 2, "two columns a row at least");
      if (col < 2) CpAsync4((col == 0 ? ksd : vsd) + j, col == 0 ? ks : vs, valid);
    } else if (col == 0) {
      CpAsync4(ksd + j, ks, valid);
      CpAsync4(vsd + j, vs, valid);
    }
  }

  // Keys [kt + row0, kt + row0 + kRows) of the stage of keys [kt, kt +
  // kKeys) into rows row0.. of `stage` by cp.async, by kLanes threads (t:
  // this one's index among them), each keeping one 16-byte column of the
  // rows; committed as one group (empty where kt + row0 >= ke). The whole
  // block (row0 0, kRows kKeys, kLanes the block) or one warp (its own
  // rows: only that warp reads them, after its own wait and a __syncwarp).
  template <int kD, int kKeys, int kRows, int kLanes, bool kSplitScales = false>
  __device__ __forceinline__ void IssueRows(int kt, int row0, uint8_t* stage, int t) const {
    static_assert(Fp8IssueCovers(kD, kRows, kLanes), "lanes must cover whole rows");
    constexpr int kVpr = kD / 16;  // 16-byte chunks per row
    constexpr int kRowsPerPass = kLanes / kVpr;
    constexpr int kPasses = kRows / kRowsPerPass;
    const int col = t % kVpr;
    const int j0 = row0 + t / kVpr;
    if (kt + row0 < ke) {
      if constexpr (kLanes == 32) {
        // One warp's few rows: unrolled, so that the rows' page-table
        // reads overlap instead of each waiting for the one before.
#pragma unroll
        for (int i = 0; i < kPasses; ++i)
          CopyRow<kD, kKeys, kSplitScales>(kt + j0 + i * kRowsPerPass, j0 + i * kRowsPerPass, col,
                                           stage);
      } else {
#pragma unroll 1
        for (int i = 0; i < kPasses; ++i)
          CopyRow<kD, kKeys, kSplitScales>(kt + j0 + i * kRowsPerPass, j0 + i * kRowsPerPass, col,
                                           stage);
      }
    }
    CpAsyncCommit();
  }

  // The whole stage by the block (prompt tiles: every warp reads every key).
  template <int kD, int kKeys, int kThreads>
  __device__ __forceinline__ void IssueFixed(int kt, uint8_t* stage, int tid) const {
    IssueRows<kD, kKeys, kKeys, kThreads>(kt, 0, stage, tid);
  }

  // A stage's scales (kKeys floats each) in shared memory.
  template <int kD, int kKeys>
  __device__ __forceinline__ static const float* KeyScales(const uint8_t* stage) {
    return reinterpret_cast<const float*>(stage + Fp8KeyScalesAt(kD, kKeys));
  }
  template <int kD, int kKeys>
  __device__ __forceinline__ static const float* ValueScales(const uint8_t* stage) {
    return reinterpret_cast<const float*>(stage + Fp8ValueScalesAt(kD, kKeys));
  }

  // Widens rows [row0, row0 + kRows) of a landed stage (kKeys rows) into
  // the same rows of the bf16 tiles Kd / Vd (rows of DP elements), by kLanes
  // threads (t: this one's index), 8 bytes a thread at a time (consecutive
  // threads read consecutive bytes and write consecutive 16-byte runs: no
  // bank conflicts). The caller synchronises the threads before and after.
  template <int kD, int kKeys, int kRows, int kLanes>
  __device__ __forceinline__ static void ConvertRows(const uint8_t* stage, bf16* Kd, bf16* Vd,
                                                     int DP, int row0, int t) {
    static_assert(Fp8ConvertCovers(kD, kRows, kLanes), "threads must cover the rows evenly");
    constexpr int kVpr = kD / 8;                   // 8-byte groups per row
    constexpr int kIters = kRows * kVpr / kLanes;  // per K (and per V)
    const uint2* kq = reinterpret_cast<const uint2*>(stage + row0 * kD);
    const uint2* vq = reinterpret_cast<const uint2*>(stage + (kKeys + row0) * kD);
#pragma unroll
    for (int it = 0; it < 2 * kIters; ++it) {
      const bool v = it >= kIters;
      const int gi = t + (v ? it - kIters : it) * kLanes;
      const int j = row0 + gi / kVpr, col = gi % kVpr;
      const uint2 raw = (v ? vq : kq)[gi];
      *reinterpret_cast<uint4*>((v ? Vd : Kd) + j * DP + col * 8) = E4m3x8ToBf16(raw);
    }
  }

  // The whole stage by the block.
  template <int kD, int kKeys, int kThreads>
  __device__ __forceinline__ static void Convert(const uint8_t* stage, bf16* Kd, bf16* Vd, int DP,
                                                 int tid) {
    ConvertRows<kD, kKeys, kKeys, kThreads>(stage, Kd, Vd, DP, 0, tid);
  }
};

}  // namespace agentkv::backend::cuda::kernels
