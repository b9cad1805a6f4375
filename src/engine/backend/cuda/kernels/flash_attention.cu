// Paged attention on mma.sync (head_dim 64 and 128): the scores, the
// softmax state and the output stay in registers, in the documented
// m16n8k16 fragment layouts, and only K/V tiles pass through shared memory
// (loaded once per block with cp.async, read with ldmatrix). The WMMA
// kernels of attention.cu staged S and O through shared memory on every
// 32 keys, which bounded them by shared-memory bandwidth, not by the cache
// reads.
//
// A block has four warps and takes 16 * RW query rows of one tile (the G
// heads of consecutive tokens sharing one KV head). Wide tiles (prefill,
// RW = 4): each warp owns 16 rows and walks every key. Narrow tiles (decode,
// RW = 1): the four warps own the same 16 rows and split each 64-key stage
// between them, merging their partial softmax states through shared memory
// at the end. Keys come in stages of 64, double-buffered.
//
// The kernel is templated on its tile loader: KvLoader (bf16 cache rows
// straight into the bf16 tiles) or Fp8KvLoader (fp8_kv_tile.cuh: the e4m3
// rows and their scales into a staging area three stages deep, widened to
// one bf16 tile per stage; each score is multiplied by its key's scale
// before the softmax and each weight by its value row's scale before P.V,
// the row sums staying unscaled). The tensor-core math is the same for
// both. With fp8 on narrow tiles each warp loads, waits for and widens only
// its own 16 keys of a stage, without block barriers between stages. The
// shared-memory layout of every instantiation is mma_attention_layout.h's.
#include <cuda_bf16.h>

#include "engine/backend/cuda/kernels/attention_common.cuh"
#include "engine/backend/cuda/kernels/attention_softmax.cuh"
#include "engine/backend/cuda/kernels/fp8_kv_tile.cuh"
#include "engine/backend/cuda/kernels/head_projection.cuh"
#include "engine/backend/cuda/kernels/mma.cuh"
#include "engine/backend/cuda/kernels/mma_attention_layout.h"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/per_device_once.h"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = kMmaThreads;
constexpr int kStage = kMmaStage;  // keys per pipeline stage

// What LaunchQkvPost does to one head, by one warp (head_projection.cuh).
template <int D>
__device__ __forceinline__ void ProjectHead(const float* src, const float* b, const float* nw,
                                            const AttentionParams& p, float pos, bool rotary,
                                            bf16* dst, int lane) {
  HeadRegs<D> r;
  LoadHead<D>(src, b, r, lane, p.qkv_planes, p.qkv_plane);
  FinishHead<D>(r, nw, p.eps, p.plus_one, p.inv_freq, p.rope_factor, pos, rotary, dst, nullptr,
                lane);
}

// Wide tiles at four blocks per SM (134 registers allowed three, and a
// 2,048-token prefill step ran 3.1 waves of them). kLean: the lean fp8
// decode form (narrow fp8 tiles only; mma_attention_layout.h's
// MmaFp8Stages and MmaMinBlocks say what it changes, and why).
template <int D, int RW, class Loader, bool kLean = false>
__global__ void __launch_bounds__(kThreads, MmaMinBlocks(D, RW, Loader::kFp8, kLean))
    MmaAttentionKernel(const AttentionParams p) {
  // Before PdlWait this kernel reads only what no kernel of the step writes:
  // the step metadata (copied in before the step's first kernel) and cache
  // rows of earlier steps (keys before `start`). It writes nothing before it.
  PdlLaunchDependents();
  constexpr int DP = D + 8;         // smem row stride (bf16): conflict-free ldmatrix
  constexpr int KW = 4 / RW;        // warps sharing the rows, splitting the keys
  constexpr int KPW = kStage / KW;  // keys per warp per stage (64 or 16)
  constexpr int NS = KPW / 8;       // score fragments (n8) per warp per stage
  constexpr int NO = D / 8;         // output fragments (n8)
  constexpr int KQ = D / 16;        // k16 steps over head_dim
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool F8 = Loader::kFp8;
  // Narrow fp8 tiles: each warp streams its own KPW keys of every stage
  // (issues their rows, waits for its own copies, widens them into its own
  // rows of the bf16 tiles) and meets the other warps only at the merge: no
  // block barrier per stage. Wide tiles share every key, so the block
  // loads and widens each stage together.
  constexpr bool kWarpStages = F8 && RW == 1;
  static_assert(!kLean || (F8 && RW == 1), "the lean form is fp8 decode's");
  constexpr MmaAttentionLayout L = MmaLayout(D, RW, F8, kLean);
  static_assert(L.dp == DP && L.key_warps == KW, "the layout is this kernel's");
  bf16* Qs = reinterpret_cast<bf16*>(smem + L.q_at);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L.k_at);  // stage b at Ks + b * kStage * DP
  bf16* Vs = reinterpret_cast<bf16*>(smem + L.v_at);
  // fp8: stage b (< FS) of the e4m3 rows and scales at staging + b *
  // kStageBytes; FS - 1 of them in flight.
  uint8_t* staging = smem + L.staging_at;
  constexpr int kStageBytes = static_cast<int>(L.stage_bytes);
  constexpr int FS = F8 ? L.fp8_stages : 2;
  static_assert(!F8 || FS >= 2, "at least one stage in flight");

  // Heads fastest: the tiles come in the order the caller sorted them
  // (longest first for prefill), not one head's tiles after another's.
  const int kvh = blockIdx.x, tile = blockIdx.y, split = blockIdx.z;
  const int n = p.tile_n[tile];
  if (n <= 0) {
    PdlWait();  // every block waits: the kernel ends after the one before it
    return;
  }
  const TileSpan ts = SpanOf(p, tile, n, split);
  const int s = ts.s, t0 = ts.t0, start = ts.start, first = ts.first, p0 = ts.p0;
  const int kb = ts.kb, ke = ts.ke;
  const int G = p.nh / p.nkv;
  const int tpt = 16 * RW / G;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rg = warp % RW, kw = warp / RW;  // row group; key share
  const int g = lane >> 2, q4 = lane & 3;    // fragment row / column pair
  // This thread's two rows (g, g + 8) of the warp's 16.
  const QueryRows qr = TileRows(p, rg, g, t0, n, tpt, kvh, G);

  if (kb >= ke) {  // an empty split: contributes nothing
    PdlWait();
    if (kw == 0) StoreEmptySplit<D>(p, qr, split, q4);
    return;
  }

  const Loader ld = [&] {
    if constexpr (F8)
      return Loader(p, s, kvh, start, first, ke);
    else
      return Loader(p, s, kvh, start, first, ke, DP, RW == 1);
  }();
  const bf16* kn = nullptr;
  const bf16* vn = nullptr;
  // Stage kt into buffer b (bf16: the tiles; fp8: the staging area).
  auto issue = [&](int kt, int b) {
    if constexpr (kWarpStages)
      ld.template IssueRows<D, kStage, KPW, 32, kLean>(kt, kw * KPW, staging + b * kStageBytes,
                                                       lane);
    else if constexpr (F8)
      ld.template IssueFixed<D, kStage, kThreads>(kt, staging + b * kStageBytes, tid);
    else
      ld.template IssueFixed<D, kStage, kThreads>(kt, Ks + b * kStage * DP, Vs + b * kStage * DP,
                                                  DP, tid, kn, vn);
  };
  // The first stage goes out before the wait where all its keys are older
  // than the step's tokens (the previous kernels' latency hides its own).
  const bool early = min(kb + kStage, ke) <= start;
  if (early) issue(kb, 0);
  PdlWait();
  if constexpr (!F8) {
    if (RW == 1 && p.qkv != nullptr) {
      // The projection, not q / k_new / v_new (decode: one token, pos start).
      const int heads = p.nh + 2 * p.nkv;
      const float* row = p.qkv + static_cast<int64_t>(t0) * heads * D;
      const float* brow = p.bias;
      const float pos = static_cast<float>(start);
      if (kb <= start && start < ke) {
        // This block's keys include the token: its K and V, into shared
        // memory for the stage that holds it and into the cache.
        bf16* Kn = reinterpret_cast<bf16*>(smem + L.own_at);
        bf16* Vn = Kn + D;
        if (warp < 2) {
          const int hh = warp == 0 ? p.nh + kvh : p.nh + p.nkv + kvh;
          bf16* dst = warp == 0 ? Kn : Vn;
          ProjectHead<D>(row + hh * D, brow ? brow + hh * D : nullptr,
                         warp == 0 ? p.k_norm : nullptr, p, pos, warp == 0, dst, lane);
          __syncwarp();
          bf16* crow = ld.CacheRow(start) +
                       (warp == 0 ? 0 : static_cast<int64_t>(p.cache.block_size) * ld.kv_row);
          for (int i = lane; i < D / 8; i += 32)
            reinterpret_cast<uint4*>(crow)[i] = reinterpret_cast<const uint4*>(dst)[i];
        }
        __syncthreads();
        kn = Kn;
        vn = Vn;
      }
      if (!early) issue(kb, 0);
      for (int r = warp; r < 16; r += 4) {
        bf16* dst = Qs + r * DP;
        if (r < G) {
          const int hh = kvh * G + r;
          ProjectHead<D>(row + hh * D, brow ? brow + hh * D : nullptr, p.q_norm, p, pos, true, dst,
                         lane);
        } else {
          for (int i = lane; i < D; i += 32) dst[i] = __float2bfloat16_rn(0.f);
        }
      }
    } else {
      if (!early) issue(kb, 0);
      LoadQueryTile(p, t0, n, tpt, kvh, 16 * RW, DP, Qs, tid, kThreads);
    }
  } else {  // fp8: no fused projection (the launcher refuses qkv)
    if (!early) issue(kb, 0);
#pragma unroll
    for (int b = 1; b < FS - 1; ++b) issue(kb + b * kStage, b);  // (past ke: empty groups)
    LoadQueryTile(p, t0, n, tpt, kvh, 16 * RW, DP, Qs, tid, kThreads);
  }
  __syncthreads();
  uint32_t qf[KQ][4];  // Q as A fragments, for the whole walk
  {
    const bf16* base = Qs + (rg * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * DP + 8 * (lane >> 4);
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) Ldsm4(qf[kk], base + kk * 16);
  }

  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // m in log2 units
  // Stages every key of which every row may see need no mask: all keys
  // before ke, none after the tile's first position, no window, no softcap.
  const bool plain = p.window == 0 && !(p.softcap > 0.f);
  int buf = 0;
  for (int kt = kb; kt < ke; kt += kStage) {
    if constexpr (F8) {
      // FS - 1 stages ahead, into the buffer the previous stage used (its
      // readers passed that stage's closing barrier); one group a stage,
      // empty past ke, so that the wait is always for the oldest of FS.
      issue(kt + (FS - 1) * kStage, buf == 0 ? FS - 1 : buf - 1);
      CpAsyncWait<FS - 1>();
    } else if (kt + kStage < ke) {
      issue(kt + kStage, buf ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    const int k0 = kt + kw * KPW;  // this warp's first key of the stage
    const uint8_t* stage = staging + buf * kStageBytes;
    if constexpr (kWarpStages) {
      // Only this warp's copies and rows: its own wait, then the lanes see
      // each other's. (Its rows' last readers passed the previous stage's
      // closing __syncwarp.)
      __syncwarp();
      if (k0 < ke) Fp8KvLoader::ConvertRows<D, kStage, KPW, 32>(stage, Ks, Vs, DP, kw * KPW, lane);
      __syncwarp();
    } else if constexpr (F8) {
      __syncthreads();
      // (The tiles' last readers finished before the previous stage's
      // closing barrier.)
      Fp8KvLoader::Convert<D, kStage, kThreads>(stage, Ks, Vs, DP, tid);
      __syncthreads();
    } else {
      __syncthreads();
    }
    if (k0 < ke) {
      const int tb = F8 ? 0 : buf;  // the bf16 tiles' stage
      const bf16* Kb = Ks + tb * kStage * DP + kw * KPW * DP;
      const bf16* Vb = Vs + tb * kStage * DP + kw * KPW * DP;
      float sc[NS][4];
#pragma unroll
      for (int j = 0; j < NS; ++j) {  // S = Q K^T, 8 keys at a time
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
        const bf16* kr = Kb + (j * 8 + (lane & 7)) * DP + 8 * (lane >> 3);
#pragma unroll
        for (int kk = 0; kk < KQ; kk += 2) {
          uint32_t b[4];
          Ldsm4(b, kr + kk * 16);
          Mma(sc[j], qf[kk], b[0], b[1]);
          Mma(sc[j], qf[kk + 1], b[2], b[3]);
        }
      }
      if constexpr (F8) {  // the keys' scales (0 past ke: those are masked)
        const float* ksc = Fp8KvLoader::KeyScales<D, kStage>(stage) + kw * KPW + 2 * q4;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          const float2 f = *reinterpret_cast<const float2*>(ksc + j * 8);
          sc[j][0] *= f.x;
          sc[j][1] *= f.y;
          sc[j][2] *= f.x;
          sc[j][3] *= f.y;
        }
      }
      // Online softmax over the two rows; a row's four lanes share it.
      SoftmaxStage<NS, NO>(sc, o, m, l, plain && kt + kStage <= ke && kt + kStage <= p0 + 1, p, qr,
                           k0, ke, q4);
      if constexpr (F8) {  // the value rows' scales, into the weights
        const float* vsc = Fp8KvLoader::ValueScales<D, kStage>(stage) + kw * KPW + 2 * q4;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          const float2 f = *reinterpret_cast<const float2*>(vsc + j * 8);
          sc[j][0] *= f.x;
          sc[j][1] *= f.y;
          sc[j][2] *= f.x;
          sc[j][3] *= f.y;
        }
      }
      // O += P V, 16 keys at a time: the score fragments of keys
      // [16c, 16c + 16) are the A fragment as they stand.
#pragma unroll
      for (int c = 0; c < NS / 2; ++c) {
        const uint32_t a[4] = {PackBf16(sc[2 * c][0], sc[2 * c][1]),
                               PackBf16(sc[2 * c][2], sc[2 * c][3]),
                               PackBf16(sc[2 * c + 1][0], sc[2 * c + 1][1]),
                               PackBf16(sc[2 * c + 1][2], sc[2 * c + 1][3])};
        const bf16* vr = Vb + (c * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * DP + 8 * (lane >> 4);
#pragma unroll
        for (int j = 0; j < NO; j += 2) {
          uint32_t b[4];
          Ldsm4T(b, vr + j * 8);
          Mma(o[j], a, b[0], b[1]);
          Mma(o[j + 1], a, b[2], b[3]);
        }
      }
    }
    // Every reader of `buf` is done with it before it is refilled.
    if constexpr (kWarpStages)
      __syncwarp();
    else
      __syncthreads();
    buf = F8 ? (buf + 1 == FS ? 0 : buf + 1) : buf ^ 1;
  }
  if constexpr (F8) CpAsyncWait<0>();  // (only empty groups are left)
  // The merge below reuses the tiles: every warp must be past its stages.
  if constexpr (kWarpStages) __syncthreads();

  if constexpr (RW == 1) {
    // Merge the four warps' states for the same 16 rows: each writes its
    // unnormalised output and (m, l) per row; then every thread combines
    // some elements. The stages' shared memory is free by now.
    float* ms = reinterpret_cast<float*>(smem);  // [4][16][D + 2]
    constexpr int MP = D + 2;
    float* mine = ms + warp * 16 * MP;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float* rowp = mine + (g + 8 * i) * MP;
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        rowp[j * 8 + 2 * q4] = o[j][2 * i];
        rowp[j * 8 + 2 * q4 + 1] = o[j][2 * i + 1];
      }
      if (q4 == 0) {
        rowp[D] = m[i];
        rowp[D + 1] = l[i];
      }
    }
    __syncthreads();
    for (int e = tid; e < 16 * D; e += kThreads) {
      const int r = e / D, d = e % D;
      const int tok = r / G;
      if (!(tok < tpt && tok < n)) continue;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < 4; ++w) M = fmaxf(M, ms[(w * 16 + r) * MP + D]);
      float L = 0.f, acc = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float* rw = ms + (w * 16 + r) * MP;
        const float wt = rw[D] == -INFINITY ? 0.f : exp2f(rw[D] - M);
        L += wt * rw[D + 1];
        acc += wt * rw[d];
      }
      const int64_t orow = static_cast<int64_t>(t0 + tok) * p.nh + kvh * G + r % G;
      if (p.splits == 1) {
        const float y = p.sinks == nullptr
                            ? (L > 0.f ? acc / L : 0.f)
                            : acc * SoftmaxNormaliser(M == -INFINITY ? -INFINITY : M / kLog2e, L,
                                                      p.sinks, kvh * G + r % G);
        reinterpret_cast<bf16*>(p.out)[orow * D + d] = __float2bfloat16_rn(y);
      } else {
        const int64_t b = orow * p.splits + split;
        p.part_o[b * D + d] = acc;
        if (d == 0) {
          p.part_ml[b * 2] = M == -INFINITY ? -INFINITY : M / kLog2e;  // natural log units
          p.part_ml[b * 2 + 1] = L;
        }
      }
    }
  } else {
    StoreRows<D, NO>(p, qr, o, m, l, split, q4);
  }
}

template <int D, int RW, class Loader = KvLoader, bool kLean = false>
cudaError_t Launch(const AttentionParams& p, LaunchConfig launch) {
  constexpr MmaAttentionLayout kLayout = MmaLayout(D, RW, Loader::kFp8, kLean);
  static_assert(kLayout.bytes <= kMmaMaxSmemBytes, "the tiles must fit a block");
  const size_t smem = kLayout.bytes;
  static PerDeviceOnce raised;  // (per device: the attribute is the context's)
  if (smem > kDefaultSmemBytes) {
    const cudaError_t e = raised.Run([smem] {
      const cudaError_t r =
          cudaFuncSetAttribute(MmaAttentionKernel<D, RW, Loader, kLean>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      // The lean form's blocks per SM need all of the SM's shared memory
      // (four of 55.5 KiB, three of 71 KiB), not a carveout the driver
      // picked for fewer.
      if (r != cudaSuccess || !kLean) return r;
      return cudaFuncSetAttribute(MmaAttentionKernel<D, RW, Loader, kLean>,
                                  cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared);
    });
    if (e != cudaSuccess) return e;
  }
  if (p.num_tiles > 65535) return cudaErrorInvalidConfiguration;  // grid y
  return LaunchPdl(MmaAttentionKernel<D, RW, Loader, kLean>, dim3(p.nkv, p.num_tiles, p.splits),
                   dim3(kThreads), smem, launch, p);
}

template <int D>
int Bf16DecodeBlocksPerSm() {
  constexpr MmaAttentionLayout kLayout = MmaLayout(D, 1, false);
  const size_t smem = kLayout.bytes;
  if (smem > kDefaultSmemBytes && cudaFuncSetAttribute(MmaAttentionKernel<D, 1, KvLoader>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(smem)) != cudaSuccess)
    return 0;
  int n = 0;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, MmaAttentionKernel<D, 1, KvLoader>,
                                                       kThreads, smem) == cudaSuccess
             ? n
             : 0;
}

}  // namespace

int MmaBf16DecodeBlocksPerSm(int head_dim) {
  if (head_dim == 64) return Bf16DecodeBlocksPerSm<64>();
  if (head_dim == 128) return Bf16DecodeBlocksPerSm<128>();
  return 0;
}

bool MmaAttentionSupported(int head_dim) { return head_dim == 64 || head_dim == 128; }

cudaError_t LaunchMmaAttention(const AttentionParams& p, LaunchConfig launch) {
  if (p.cache.fp8) {  // wide (prompt) and narrow (decode) tiles alike
    if (p.qkv != nullptr || p.kv_map != nullptr || p.fp8_new.k == nullptr ||
        p.fp8_new.v == nullptr || p.fp8_new.k_scale == nullptr || p.fp8_new.v_scale == nullptr)
      return cudaErrorInvalidValue;
    if (p.head_dim == 64) {
      if (p.wide) return Launch<64, 4, Fp8KvLoader>(p, launch);
      return p.fp8_decode_lean ? Launch<64, 1, Fp8KvLoader, true>(p, launch)
                               : Launch<64, 1, Fp8KvLoader>(p, launch);
    }
    if (p.head_dim == 128) {
      if (p.wide) return Launch<128, 4, Fp8KvLoader>(p, launch);
      return p.fp8_decode_lean ? Launch<128, 1, Fp8KvLoader, true>(p, launch)
                               : Launch<128, 1, Fp8KvLoader>(p, launch);
    }
    return cudaErrorInvalidValue;
  }
  if (p.head_dim == 64 && p.wide && p.wgmma && WgmmaAttentionSupported(64))
    return LaunchWgmmaWideAttention(p, launch);
  if (p.head_dim == 64) return p.wide ? Launch<64, 4>(p, launch) : Launch<64, 1>(p, launch);
  if (p.head_dim == 128) return p.wide ? Launch<128, 4>(p, launch) : Launch<128, 1>(p, launch);
  return cudaErrorInvalidValue;
}

}  // namespace agentkv::backend::cuda::kernels
