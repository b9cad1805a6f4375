// Pieces the paged attention kernels share (device code only): cp.async
// wrappers and the loader of K/V tiles from the paged cache.
#pragma once

#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {

using bf16 = __nv_bfloat16;

// (At a shared-memory address: the swizzled tiles of the warpgroup GEMM.)
__device__ __forceinline__ void CpAsync16At(unsigned s, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  CpAsync16At(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, valid);
}
// CpAsync16 with an L2 eviction-priority policy (EvictFirstPolicy): the
// paged K/V stream, read once per step, goes first, so that it does not push
// the step metadata and activations the next loads depend on out of L2.
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void CpAsync16Hint(void* smem, const void* gmem, bool valid,
                                              uint64_t policy) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s),
               "l"(gmem), "r"(n), "l"(policy));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// r / G for the heads-per-KV-head count G: a shift where G is a power of
// two (every model here; the integer division is ~20 instructions).
__device__ __forceinline__ int DivG(int r, int G) {
  return (G & (G - 1)) == 0 ? r >> (__ffs(G) - 1) : r / G;
}

// What multiplies a query row's unnormalised output (m: the largest score
// seen, natural log units; l: the sum of exp(score - m)) to give the
// softmax-weighted one: 1 / l, or, with an attention sink (sinks[head], a
// per-head logit that joins the denominator unscaled and carries no value),
// exp(m - M) / (l exp(m - M) + exp(sink - M)) with M = max(m, sink), so
// that neither exponent overflows. Rows that saw no key (m = -inf) get 0.
__device__ __forceinline__ float SoftmaxNormaliser(float m, float l, const float* sinks, int head) {
  if (sinks == nullptr) return l > 0.f ? 1.f / l : 0.f;
  if (m == -INFINITY) return 0.f;
  const float sink = sinks[head];
  const float M = fmaxf(m, sink);
  const float a = expf(m - M);
  return a / (l * a + expf(sink - M));
}

// Copies a tile's `rows` query rows into Qs (rows of DP elements): row r is
// head kvh * G + r % G of token t0 + r / G, zeros past the tile's n tokens
// (and its tpt).
__device__ __forceinline__ void LoadQueryTile(const AttentionParams& p, int t0, int n, int tpt,
                                              int kvh, int rows, int DP, bf16* Qs, int tid,
                                              int threads) {
  const int D = p.head_dim, G = p.nh / p.nkv, vpr = D / 8;  // 16-byte vectors per row
  const bf16* qg = reinterpret_cast<const bf16*>(p.q);
  for (int i = tid; i < rows * vpr; i += threads) {
    const int r = i / vpr, c = i % vpr;
    const int tok = r / G, h = r % G;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tok < tpt && tok < n)
      v = *reinterpret_cast<const uint4*>(
          qg + (static_cast<int64_t>(t0 + tok) * p.nh + kvh * G + h) * D + c * 8);
    *reinterpret_cast<uint4*>(Qs + r * DP + c * 8) = v;
  }
}

// LoadQueryTile for a head_dim known at compile time, with cp.async (one
// group, committed): nothing waits on the loads until the first K/V stage
// is waited for, and no division but by G. The synchronous form stalled
// each warp of a prompt tile for a round trip to memory before its first
// stage (15% of the warpgroup kernel's stall samples, with its integer
// divisions).
template <int kD>
__device__ __forceinline__ void LoadQueryTileAsync(const AttentionParams& p, int t0, int n, int tpt,
                                                   int kvh, int G, int rows, int DP, bf16* Qs,
                                                   int tid, int threads) {
  constexpr int kVpr = kD / 8;  // 16-byte vectors per row
  const bf16* qg =
      reinterpret_cast<const bf16*>(p.q) + (static_cast<int64_t>(t0) * p.nh + kvh * G) * kD;
  for (int i = tid; i < rows * kVpr; i += threads) {
    const int r = i / kVpr, c = i % kVpr;
    const int tok = DivG(r, G), h = r - tok * G;
    const bool valid = tok < tpt && tok < n;
    const bf16* src = valid ? qg + (static_cast<int64_t>(tok) * p.nh + h) * kD + c * 8 : qg;
    CpAsync16(Qs + r * DP + c * 8, src, valid);
  }
  CpAsyncCommit();
}

// Issues the K and V loads of `nkeys` keys from position kt (zero-filled
// from ke on) into rows of DP elements at Kd / Vd with cp.async, then
// commits them as one group. Keys at positions >= start are this step's
// (k_new / v_new), older ones the paged cache's.
struct KvLoader {
  static constexpr bool kFp8 = false;  // (Fp8KvLoader, fp8_kv_tile.cuh: true)
  KvCacheView c;
  const bf16* cache;
  const bf16* knew;
  const bf16* vnew;
  const bf16* dummy;  // a valid address for zero-filled loads
  const int32_t* table;
  int64_t kv_row;
  int kvh, start, first, ke, D, DP;
  // Decode: the cache rows are read once per step; prefill tiles re-read
  // them (and k_new / v_new) from L2, so they keep the default priority.
  bool evict_first;
  uint64_t policy;

  __device__ __forceinline__ KvLoader(const AttentionParams& p, int s, int kvh_, int start_,
                                      int first_, int ke_, int DP_, bool evict_first_ = false)
      : c(p.cache),
        cache(reinterpret_cast<const bf16*>(p.cache.base)),
        knew(reinterpret_cast<const bf16*>(p.k_new)),
        vnew(reinterpret_cast<const bf16*>(p.v_new)),
        dummy(reinterpret_cast<const bf16*>(p.q)),
        table(p.cache.tables + static_cast<int64_t>(s) * *p.cache.table_stride),
        kv_row(static_cast<int64_t>(p.nkv) * p.head_dim),
        kvh(kvh_),
        start(start_),
        first(first_),
        ke(ke_),
        D(p.head_dim),
        DP(DP_),
        evict_first(evict_first_),
        policy(evict_first_ ? EvictFirstPolicy() : 0) {}

  // Page and row within it of position kp (shifts for power-of-two pages).
  __device__ __forceinline__ int64_t PageRow(int kp, int& in) const {
    const int bs = c.block_size;
    const int lb = (bs & (bs - 1)) == 0 ? kp >> (__ffs(bs) - 1) : kp / bs;
    in = kp - lb * bs;
    return table[c.ring > 0 ? lb % c.ring : lb];
  }

  // This layer's cache row of position kp (K; V is block_size rows on).
  __device__ __forceinline__ bf16* CacheRow(int kp) const {
    int in;
    const int64_t blk = PageRow(kp, in);
    return reinterpret_cast<bf16*>(c.base) + blk * c.block_stride + c.layer_offset +
           static_cast<int64_t>(in) * kv_row + kvh * D;
  }

  // The K and V rows of key kp (< ke) for head_dim d: this step's k_new /
  // v_new from `start` on, the paged cache before it.
  __device__ __forceinline__ void Rows(int kp, int d, const bf16*& ks, const bf16*& vs) const {
    if (kp >= start) {
      const int64_t r = static_cast<int64_t>(first + kp - start) * kv_row + kvh * d;
      ks = knew + r;
      vs = vnew + r;
    } else {
      int in;
      const int64_t blk = PageRow(kp, in);
      ks = cache + blk * c.block_stride + c.layer_offset + static_cast<int64_t>(in) * kv_row +
           kvh * d;
      vs = ks + static_cast<int64_t>(c.block_size) * kv_row;
    }
  }

  // 16-byte column col of key kp's K and V rows (head_dim d) into column
  // dcol of the rows Krow / Vrow of shared memory, with cp.async; zeros
  // past ke.
  __device__ __forceinline__ void CopyColumn(int kp, int d, int col, bf16* Krow, bf16* Vrow,
                                             int dcol) const {
    const bool valid = kp < ke;
    const bf16* ks = dummy;
    const bf16* vs = dummy;
    if (valid) {
      Rows(kp, d, ks, vs);
      ks += col * 8;
      vs += col * 8;
    }
    if (evict_first) {
      CpAsync16Hint(Krow + dcol * 8, ks, valid, policy);
      CpAsync16Hint(Vrow + dcol * 8, vs, valid, policy);
    } else {
      CpAsync16(Krow + dcol * 8, ks, valid);
      CpAsync16(Vrow + dcol * 8, vs, valid);
    }
  }

  __device__ __forceinline__ void Issue(int kt, int nkeys, bf16* Kd, bf16* Vd, int tid,
                                        int threads) const {
    const int vpr = D / 8;
    for (int i = tid; i < nkeys * vpr; i += threads) {
      const int j = i / vpr, col = i % vpr;
      CopyColumn(kt + j, D, col, Kd + j * DP, Vd + j * DP, col);
    }
    CpAsyncCommit();
  }

  // Issue for a head_dim and thread count known at compile time: each
  // thread keeps one 16-byte column and steps over rows. The decode kernel
  // issued more instructions for these addresses than for its tensor-core
  // work. kn / vn (shared memory, kD elements each): where given, the row of
  // key `start` (the step's one token) comes from them, not from k_new /
  // v_new. kSwizzle: rows of 128 bytes (kD 64, DPd 64) with the 16-byte
  // chunk c of row j at chunk c ^ (j % 8), the layout the warpgroup MMA
  // reads (128-byte swizzle); each thread's chunk is then the same on
  // every row it copies.
  template <int kD, int kKeys, int kThreads, bool kSwizzle = false>
  __device__ __forceinline__ void IssueFixed(int kt, bf16* Kd, bf16* Vd, int DPd, int tid,
                                             const bf16* kn = nullptr,
                                             const bf16* vn = nullptr) const {
    constexpr int kVpr = kD / 8;
    static_assert(kThreads % kVpr == 0, "threads must cover whole rows");
    constexpr int kRowsPerPass = kThreads / kVpr;
    static_assert(!kSwizzle || (kVpr == 8 && kRowsPerPass % 8 == 0),
                  "the swizzle keeps a thread's chunk fixed");
    const int col = tid % kVpr;
    const int dcol = kSwizzle ? col ^ ((tid / kVpr) & 7) : col;
#pragma unroll 1
    for (int j = tid / kVpr; j < kKeys; j += kRowsPerPass) {
      const int kp = kt + j;
      const bool valid = kp < ke;
      if (valid && kn != nullptr && kp >= start) {
        *reinterpret_cast<uint4*>(Kd + j * DPd + dcol * 8) =
            *reinterpret_cast<const uint4*>(kn + col * 8);
        *reinterpret_cast<uint4*>(Vd + j * DPd + dcol * 8) =
            *reinterpret_cast<const uint4*>(vn + col * 8);
        continue;
      }
      CopyColumn(kp, kD, col, Kd + j * DPd, Vd + j * DPd, dcol);
    }
    CpAsyncCommit();
  }
};

// The mma.sync kernels of flash_attention.cu (head_dim 64 and 128);
// LaunchAttention uses them where supported (AttentionParams::mma false:
// for wide tiles only, for comparison). They write out / part_o / part_ml as
// LaunchAttention documents; the split merge is the caller's.
bool MmaAttentionSupported(int head_dim);
cudaError_t LaunchMmaAttention(const AttentionParams& p, LaunchConfig launch);
// The warpgroup kernel of wgmma_attention.cu for wide tiles (its
// support test, WgmmaAttentionSupported, is in attention.h).
cudaError_t LaunchWgmmaWideAttention(const AttentionParams& p, LaunchConfig launch);
// The fp8 cache's kernel (fp8_kv.cu): narrow tiles, p.cache.fp8, keys
// of the step from p.fp8_new; writes out / part_o / part_ml as above.
cudaError_t LaunchFp8Attention(const AttentionParams& p, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
