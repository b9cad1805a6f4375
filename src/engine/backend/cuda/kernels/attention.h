// The attention launcher (attention.cu dispatches to flash_attention.cu,
// wgmma_attention.cu and fp8_kv.cu; kv_route.h says which path a step
// takes). launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/cuda/kernels/kv_route.h"
#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {

// Attention of one layer over paged KV, flash-style (online softmax, tensor
// cores, no score matrix in memory). Work comes in tiles: tile i covers
// tile_n[i] consecutive tokens of sequence tile_seq[i] from token tile_t0[i];
// tile_n = 0 marks padding. A tile may hold at most TokensPerTile(G, wide)
// tokens (G = nh / nkv <= 16): 16 query rows, or 64 with `wide` (prefill:
// each K/V tile loaded serves four times the rows; only where
// WideAttentionSupported(head_dim)). Keys at positions >= seq_start[s] (this step's)
// are read from k_new / v_new at token seq_first[s] + (p - seq_start[s]); older ones from the
// cache. With splits > 1 each tile's keys are split across thread blocks (at most
// kMaxAttentionSplits) and merged by a second kernel through part_o / part_ml (tokens * nh *
// splits * (head_dim + 2) floats; kv_route.h).
struct AttentionParams {
  const bf16_t* q = nullptr;  // [T][nh][D]
  const bf16_t* k_new = nullptr;
  const bf16_t* v_new = nullptr;
  KvCacheView cache;
  const int32_t* pos = nullptr;        // [T]
  const int32_t* seq_start = nullptr;  // [B]
  const int32_t* seq_first = nullptr;  // [B]
  const int32_t* tile_seq = nullptr;
  const int32_t* tile_t0 = nullptr;
  const int32_t* tile_n = nullptr;
  int num_tiles = 0;
  int tokens = 0;
  int nh = 0, nkv = 0, head_dim = 0;
  int window = 0;  // 0: full
  float scale = 1.f, softcap = 0.f;
  // Attention sinks (GPT-OSS), or null: per query head one fp32 logit that
  // joins each row's softmax denominator, unscaled (neither `scale` nor
  // `softcap` applies) and without a value: p_j = e^{s_j} / (sum_i e^{s_i} +
  // e^{sink}). Every kernel applies it where it normalises a row (the split
  // merge where keys are split), so the parts stay sink-free.
  const float* sinks = nullptr;  // [nh]
  int splits = 1;
  bool wide = false;         // tiles of TokensPerTile(G, true) tokens
  float* part_o = nullptr;   // [T][nh][splits][D]
  float* part_ml = nullptr;  // [T][nh][splits][2]
  bf16_t* out = nullptr;     // [T][nh][D]
  // Decode steps (narrow tiles of one token) may leave q, k_new and v_new
  // unset and give the projection instead: each block then does what
  // LaunchQkvPostStore would for its query heads, and the block whose keys
  // include the step's token also stores that token's K and V into the
  // cache. One kernel instead of two per layer (FusedRotarySupported).
  const float* qkv = nullptr;  // [T][(nh + 2 * nkv) * D] fp32
  // The projection as qkv_planes (up to kMaxQkvPlanes) fp32 planes
  // qkv_plane floats apart (a split-K GEMM's partials, LaunchWgmmaGemm with
  // planes), added in order.
  int qkv_planes = 1;
  int64_t qkv_plane = 0;
  const float* bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr;
  float rope_factor = 1.f;  // multiplies cos and sin (YaRN's attention factor)
  float eps = 0.f;
  bool plus_one = false;
  // Prompt steps whose keys are all in the cache already (LaunchQkvPostStore
  // ran; no window): the group's TMA descriptor (EncodeKvTensorMap, in device
  // memory) lets the warpgroup kernel (head_dim 64, block_size 8 or 16)
  // copy whole pages; kv_map_layer is this layer's K plane in it (2 * its
  // index in the group; V is the next). Null: rows by cp.async.
  const void* kv_map = nullptr;
  int kv_map_layer = 0;
  // cache.fp8: the step's keys (positions >= seq_start) come from here
  // (k_new / v_new unused); `qkv` and kv_map are refused
  // (cudaErrorInvalidValue), and so are wide tiles where
  // WideAttentionSupported(head_dim) is false (the backend routes fp8 steps
  // so, see kv_route.h).
  Fp8KvRows fp8_new;
  // Kernel choices (CudaTuning, for comparison). mma: narrow tiles on the
  // mma.sync kernel where it has the head_dim (false: the portable WMMA
  // kernel; `qkv` is then refused). wgmma: wide bf16 tiles on the warpgroup
  // kernel where WgmmaAttentionSupported (false: the mma.sync kernel;
  // kv_map is then ignored and AttentionReadsCacheOnly false).
  bool mma = true;
  bool wgmma = true;
  // Narrow fp8 tiles (decode) on the lean form of the mma.sync kernel: one
  // more block per SM (registers capped, head_dim 128 with two staging
  // stages, not four), each scale copied by a thread of its own
  // (mma_attention_layout.h's MmaFp8Stages). It pays where splits give the
  // SMs the extra blocks (the backend's default: CudaTuning::fp8_decode_lean);
  // false: the old form (for comparison).
  bool fp8_decode_lean = false;
};
inline constexpr int kMaxQkvPlanes = 8;
// Writes to `map` (kKvTensorMapBytes, 64-byte aligned host memory) the TMA
// descriptor of a cache group's `blocks` blocks at `base` (`layers` layers,
// block_stride elements a block, K then V of each layer: [block_size][nkv]
// [head_dim]) for AttentionParams::kv_map. False where there is none to
// make: not head_dim 64, block_size not 8 or 16, or no driver entry point.
inline constexpr size_t kKvTensorMapBytes = 128;
// Whether LaunchAttention reads every key of this step from the cache (the
// warpgroup kernel's TMA path: kv_map set, wide tiles, head_dim 64, block
// size 8 or 16, no window or ring), so that k_new and v_new may be null
// (and LaunchQkvPostStore of a bf16 projection at head_dim 64 may skip
// writing k and v).
bool AttentionReadsCacheOnly(const AttentionParams& p);
// Whether prompt steps' attention can run on the warpgroup kernel: head_dim
// 64 on compute capability 9.0 (AttentionParams::wgmma chooses it).
bool WgmmaAttentionSupported(int head_dim);
bool EncodeKvTensorMap(const bf16_t* base, int64_t blocks, int64_t block_stride, int layers,
                       int block_size, int nkv, int head_dim, void* map);
int TokensPerTile(int group_size, bool wide = false);
bool WideAttentionSupported(int head_dim);
// Largest head_dim the attention kernel takes (a multiple of 16).
inline constexpr int kMaxAttentionHeadDim = 256;
cudaError_t LaunchAttention(const AttentionParams& p, LaunchConfig launch);
// Whether LaunchAttention takes AttentionParams::qkv for decode steps at
// this head_dim (the mma.sync kernel's; AttentionParams::mma must be set).
bool FusedRotarySupported(int head_dim);
// Blocks of the mma.sync kernel's bf16 decode form (narrow tiles of a bf16
// cache) one SM of the current device holds at once at this head_dim, as
// the driver's occupancy calculator finds them from the form's registers
// and shared memory (ptxas picks its registers, so no constant says it);
// 0 where the kernel has no such form or the query fails. The step plan
// aims bf16 decode splits at one wave of them (step_plan.h's
// DecodeWaveBlocks). Raises the form's shared-memory limit as its launch
// would.
int MmaBf16DecodeBlocksPerSm(int head_dim);

}  // namespace agentkv::backend::cuda::kernels
