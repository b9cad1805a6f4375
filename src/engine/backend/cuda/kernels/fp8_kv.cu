// The fp8 (e4m3) KV cache's kernels (docs/kv-fp8.md): quantizing a step's K
// and V rows with one f32 scale per (token, KV head) row, storing them into
// the paged cache, and the portable attention over it for head_dims the
// mma.sync kernel lacks (at 64 and 128 that kernel reads the fp8 cache
// itself through Fp8KvLoader, fp8_kv_tile.cuh; kv_route.h decides).
//
// The portable attention is the WMMA kernel of attention.cu in structure (16
// query rows of one KV head a block, 32 keys a tile, scores and P.V on the
// tensor cores, online softmax in fp32, key splits merged by its combine
// kernel) with the K/V tiles converted on their way into shared memory:
// e4m3 values are exact in bf16 (4 significant bits, exponents 2^-9..2^8),
// so a tile holds the stored values unscaled, each score is multiplied by
// its key's scale in fp32, and each softmax weight by its value row's scale
// before it is rounded to bf16 for P.V (the row sums use the unscaled
// weights). Loads are plain (not cp.async double-buffered): one kernel for
// prefill and decode, correct first; see docs/kv-fp8.md for what is left.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <mma.h>

#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/cuda/kernels/fp8_kv_tile.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"
#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace nvcuda;

constexpr float kFp8Max = 448.f;

__device__ __forceinline__ uint8_t EncodeE4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float Bf16Bits(bf16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

// One warp per (token, row): rows 0..nkv-1 are K heads, nkv..2nkv-1 V heads.
constexpr int kQuantWarps = 4;
__global__ void __launch_bounds__(32 * kQuantWarps)
    KvQuantizeFp8Kernel(const bf16_t* k, const bf16_t* v, const int32_t* pos, int tokens, int nkv,
                        int D, Fp8KvRows rows) {
  PdlLaunchDependents();
  PdlWait();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
  if (r >= static_cast<int64_t>(tokens) * 2 * nkv) return;
  const int t = static_cast<int>(r / (2 * nkv)), h = static_cast<int>(r % (2 * nkv));
  if (pos[t] < 0) return;
  const bool is_k = h < nkv;
  const int64_t row = static_cast<int64_t>(t) * nkv + (is_k ? h : h - nkv);
  const bf16_t* src = (is_k ? k : v) + row * D;
  float amax = 0.f;
  for (int i = lane; i < D; i += 32) amax = fmaxf(amax, fabsf(Bf16Bits(src[i])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // As kvfp8::QuantizeRow: IEEE divisions (nvcc's default -prec-div=true).
  const float scale = __fdiv_rn(amax, kFp8Max);
  const float inv = amax > 0.f ? __fdiv_rn(kFp8Max, amax) : 0.f;
  uint8_t* dst = (is_k ? rows.k : rows.v) + row * D;
  for (int i = lane; i < D; i += 32) dst[i] = EncodeE4m3(__fmul_rn(Bf16Bits(src[i]), inv));
  if (lane == 0) (is_k ? rows.k_scale : rows.v_scale)[row] = scale;
}

// Byte address of a layer's K section (V is one section on) of the block
// holding position p of sequence s, and the row within the block.
__device__ __forceinline__ uint8_t* Fp8Section(const KvCacheView& c, const int32_t* table, int p,
                                               int& in) {
  const int lb = p / c.block_size;
  in = p - lb * c.block_size;
  const int64_t blk = table[c.ring > 0 ? lb % c.ring : lb];
  return reinterpret_cast<uint8_t*>(c.base) + blk * c.block_stride + c.layer_offset;
}

// One block per token.
__global__ void KvStoreFp8Kernel(Fp8KvRows rows, const int32_t* pos, const int32_t* tok_seq,
                                 const int32_t* seq_start, const int32_t* seq_first, int nkv, int D,
                                 KvCacheView c) {
  PdlLaunchDependents();
  PdlWait();
  const int t = blockIdx.x;
  const int p = pos[t];
  if (p < 0) return;
  const int s = tok_seq[t];
  if (c.ring > 0) {
    // Of the step's tokens that share a ring slot only the newest writes.
    const int end = seq_start[s] + (seq_first[s + 1] - seq_first[s]);
    if (p + c.ring * c.block_size < end) return;
  }
  const int32_t* table = c.tables + static_cast<int64_t>(s) * *c.table_stride;
  int in;
  uint8_t* ksec = Fp8Section(c, table, p, in);
  const int64_t section = static_cast<int64_t>(c.block_size) * nkv * (D + 4);
  uint8_t* vsec = ksec + section;
  const int64_t scales = static_cast<int64_t>(c.block_size) * nkv * D;
  const int64_t n = static_cast<int64_t>(nkv) * D;  // bytes of a token's row, a multiple of 16
  const int64_t src = static_cast<int64_t>(t) * n;
  for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(ksec + in * n)[i] = reinterpret_cast<const uint4*>(rows.k + src)[i];
    reinterpret_cast<uint4*>(vsec + in * n)[i] = reinterpret_cast<const uint4*>(rows.v + src)[i];
  }
  for (int h = threadIdx.x; h < nkv; h += blockDim.x) {
    reinterpret_cast<float*>(ksec + scales)[in * nkv + h] = rows.k_scale[t * nkv + h];
    reinterpret_cast<float*>(vsec + scales)[in * nkv + h] = rows.v_scale[t * nkv + h];
  }
}

constexpr int kRows = 16;  // query rows per block
constexpr int kKeys = 32;  // keys per tile
constexpr int kThreads = 128;
constexpr int kSP = kKeys + 4;  // score row stride (floats)
constexpr int kPP = kKeys + 8;  // probability row stride (bf16)

size_t SmemBytes(int D) {
  const size_t DP = D + 8, OP = D + 4;
  return (kRows * DP + 2 * kKeys * DP) * sizeof(bf16) + 2 * kRows * kSP * sizeof(float) +
         kRows * kPP * sizeof(bf16) + kRows * OP * sizeof(float) + 2 * kKeys * sizeof(float);
}

__global__ void __launch_bounds__(kThreads) Fp8AttentionKernel(const AttentionParams p) {
  PdlLaunchDependents();
  PdlWait();
  extern __shared__ __align__(128) unsigned char smem[];
  const int D = p.head_dim, DP = D + 8, OP = D + 4;
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kRows * DP;
  bf16* Vs = Ks + kKeys * DP;
  float* S = reinterpret_cast<float*>(Vs + kKeys * DP);
  bf16* P = reinterpret_cast<bf16*>(S + 2 * kRows * kSP);
  float* O = reinterpret_cast<float*>(P + kRows * kPP);
  float* kscale = O + kRows * OP;
  float* vscale = kscale + kKeys;

  const int tile = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int n = p.tile_n[tile];
  if (n <= 0) return;
  const int s = p.tile_seq[tile], t0 = p.tile_t0[tile];
  const int G = p.nh / p.nkv;
  const int tpt = kRows / G;
  const int start = p.seq_start[s], first = p.seq_first[s];
  const int p0 = p.pos[t0], p1 = p.pos[t0 + n - 1];
  const int lo = p.window > 0 ? max(0, p0 - p.window + 1) : 0;
  const int hi = p1 + 1;
  const int chunk = ((hi - lo + p.splits - 1) / p.splits + kKeys - 1) / kKeys * kKeys;
  const int kb = lo + split * chunk;
  const int ke = min(hi, kb + chunk);

  const int tid = threadIdx.x, warp = tid >> 5;
  const int row = tid >> 3, sub = tid & 7;  // softmax: 8 threads per row
  const int rtok = row / G, rh = row % G;
  const bool rvalid = rtok < tpt && rtok < n;
  const int rpos = rvalid ? p.pos[t0 + rtok] : -1;
  const int64_t out_row = rvalid ? (static_cast<int64_t>(t0 + rtok) * p.nh + kvh * G + rh) : 0;

  if (kb >= ke) {  // an empty split: contributes nothing
    if (rvalid) {
      const int64_t b = out_row * p.splits + split;
      for (int d = sub; d < D; d += 8) p.part_o[b * D + d] = 0.f;
      if (sub == 0) {
        p.part_ml[b * 2] = -INFINITY;
        p.part_ml[b * 2 + 1] = 0.f;
      }
    }
    return;
  }

  LoadQueryTile(p, t0, n, tpt, kvh, kRows, DP, Qs, tid, kThreads);
  for (int i = tid; i < kRows * OP; i += kThreads) O[i] = 0.f;

  const KvCacheView& c = p.cache;
  const int32_t* table = c.tables + static_cast<int64_t>(s) * *c.table_stride;
  const int64_t kv_row = static_cast<int64_t>(p.nkv) * D;  // bytes of a token's K (or V) row
  const int64_t section = static_cast<int64_t>(c.block_size) * p.nkv * (D + 4);
  const int64_t scales_at = static_cast<int64_t>(c.block_size) * kv_row;
  const int vpr = D / 8;  // 8-byte groups per row

  float m = -INFINITY, l = 0.f;
  const int ksteps = D / 16, khalf = (ksteps + 1) / 2;
  for (int kt = kb; kt < ke; kt += kKeys) {
    // The tile's K and V as bf16 (exact e4m3 values) and their scales.
    for (int i = tid; i < kKeys * vpr; i += kThreads) {
      const int j = i / vpr, col = i % vpr, kp = kt + j;
      uint2 kq = make_uint2(0, 0), vq = make_uint2(0, 0);
      if (kp < ke) {
        const uint8_t* kr;
        const uint8_t* vr;
        if (kp >= start) {
          const int64_t r = (static_cast<int64_t>(first + kp - start) * p.nkv + kvh) * D;
          kr = p.fp8_new.k + r;
          vr = p.fp8_new.v + r;
        } else {
          int in;
          const uint8_t* sec = Fp8Section(c, table, kp, in);
          kr = sec + in * kv_row + kvh * D;
          vr = kr + section;
        }
        kq = reinterpret_cast<const uint2*>(kr)[col];
        vq = reinterpret_cast<const uint2*>(vr)[col];
      }
      *reinterpret_cast<uint4*>(Ks + j * DP + col * 8) = E4m3x8ToBf16(kq);
      *reinterpret_cast<uint4*>(Vs + j * DP + col * 8) = E4m3x8ToBf16(vq);
    }
    for (int j = tid; j < kKeys; j += kThreads) {
      const int kp = kt + j;
      float ks = 0.f, vs = 0.f;
      if (kp < ke) {
        if (kp >= start) {
          const int64_t r = static_cast<int64_t>(first + kp - start) * p.nkv + kvh;
          ks = p.fp8_new.k_scale[r];
          vs = p.fp8_new.v_scale[r];
        } else {
          int in;
          const uint8_t* sec = Fp8Section(c, table, kp, in);
          const int64_t r = static_cast<int64_t>(in) * p.nkv + kvh;
          ks = reinterpret_cast<const float*>(sec + scales_at)[r];
          vs = reinterpret_cast<const float*>(sec + section + scales_at)[r];
        }
      }
      kscale[j] = ks;
      vscale[j] = vs;
    }
    __syncthreads();
    {  // S (two halves over head_dim) = Q K^T, unscaled
      const int nt = warp & 1, kh = warp >> 1;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = kh * khalf; kk < min(ksteps, (kh + 1) * khalf); ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, Qs + kk * 16, DP);
        wmma::load_matrix_sync(b, Ks + nt * 16 * DP + kk * 16, DP);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(S + kh * kRows * kSP + nt * 16, acc, kSP, wmma::mem_row_major);
    }
    __syncthreads();
    {  // online softmax, 8 threads per row, 4 keys each
      float sv[4];
      float tmax = -INFINITY;
#pragma unroll
      for (int j4 = 0; j4 < 4; ++j4) {
        const int j = sub * 4 + j4, kp = kt + j;
        float x = (S[row * kSP + j] + S[kRows * kSP + row * kSP + j]) * kscale[j] * p.scale;
        if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
        const bool ok = rvalid && kp < ke && kp <= rpos && (p.window == 0 || kp > rpos - p.window);
        sv[j4] = ok ? x : -INFINITY;
        tmax = fmaxf(tmax, sv[j4]);
      }
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float m_new = fmaxf(m, tmax);
      const float alpha = m_new == -INFINITY ? 1.f : expf(m - m_new);
      float psum = 0.f;
#pragma unroll
      for (int j4 = 0; j4 < 4; ++j4) {
        const int j = sub * 4 + j4;
        const float pj = sv[j4] == -INFINITY ? 0.f : expf(sv[j4] - m_new);
        psum += pj;
        P[row * kPP + j] = __float2bfloat16_rn(pj * vscale[j]);  // V's scale folded in
      }
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l = l * alpha + psum;
      m = m_new;
      if (alpha != 1.f)
        for (int d = sub; d < D; d += 8) O[row * OP + d] *= alpha;
    }
    __syncthreads();
    for (int nt = warp; nt < ksteps; nt += kThreads / 32) {  // O += P V
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, O + nt * 16, OP, wmma::mem_row_major);
#pragma unroll
      for (int k2 = 0; k2 < kKeys / 16; ++k2) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, P + k2 * 16, kPP);
        wmma::load_matrix_sync(b, Vs + k2 * 16 * DP + nt * 16, DP);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(O + nt * 16, acc, OP, wmma::mem_row_major);
    }
    __syncthreads();
  }

  if (!rvalid) return;
  if (p.splits == 1) {
    const float inv = SoftmaxNormaliser(m, l, p.sinks, kvh * G + rh);
    bf16* out = reinterpret_cast<bf16*>(p.out) + out_row * D;
    for (int d = sub; d < D; d += 8) out[d] = __float2bfloat16_rn(O[row * OP + d] * inv);
  } else {
    const int64_t b = out_row * p.splits + split;
    for (int d = sub; d < D; d += 8) p.part_o[b * D + d] = O[row * OP + d];
    if (sub == 0) {
      p.part_ml[b * 2] = m;
      p.part_ml[b * 2 + 1] = l;
    }
  }
}

}  // namespace

cudaError_t LaunchKvQuantizeFp8(const bf16_t* k, const bf16_t* v, const int32_t* pos, int tokens,
                                int nkv, int head_dim, Fp8KvRows rows, LaunchConfig launch) {
  if (tokens <= 0) return cudaSuccess;
  if (head_dim % 16 != 0 || nkv <= 0) return cudaErrorInvalidValue;
  const int64_t r = static_cast<int64_t>(tokens) * 2 * nkv;
  return LaunchPdl(KvQuantizeFp8Kernel,
                   dim3(static_cast<unsigned>((r + kQuantWarps - 1) / kQuantWarps)),
                   dim3(32 * kQuantWarps), 0, launch, k, v, pos, tokens, nkv, head_dim, rows);
}

cudaError_t LaunchKvStoreFp8(Fp8KvRows rows, const int32_t* pos, const int32_t* tok_seq,
                             const int32_t* seq_start, const int32_t* seq_first, int tokens,
                             int nkv, int head_dim, const KvCacheView& cache, LaunchConfig launch) {
  if (tokens <= 0) return cudaSuccess;
  if (!cache.fp8 || head_dim % 16 != 0 || nkv <= 0) return cudaErrorInvalidValue;
  return LaunchPdl(KvStoreFp8Kernel, dim3(tokens), dim3(128), 0, launch, rows, pos, tok_seq,
                   seq_start, seq_first, nkv, head_dim, cache);
}

cudaError_t LaunchFp8Attention(const AttentionParams& p, LaunchConfig launch) {
  if (!p.cache.fp8 || p.wide || p.qkv != nullptr || p.kv_map != nullptr || p.fp8_new.k == nullptr ||
      p.fp8_new.v == nullptr || p.fp8_new.k_scale == nullptr || p.fp8_new.v_scale == nullptr)
    return cudaErrorInvalidValue;
  const size_t smem = SmemBytes(p.head_dim);
  static PerDeviceOnce raised;  // (per device: the attribute is the context's)
  if (smem > 48 * 1024) {
    const cudaError_t e = raised.Run([] {
      return cudaFuncSetAttribute(Fp8AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(SmemBytes(kMaxAttentionHeadDim)));
    });
    if (e != cudaSuccess) return e;
  }
  return LaunchPdl(Fp8AttentionKernel, dim3(p.num_tiles, p.nkv, p.splits), dim3(kThreads), smem,
                   launch, p);
}

}  // namespace agentkv::backend::cuda::kernels
