// Which attention path a step takes, given the KV cache dtype. Both caches
// have the mma.sync flash kernel (flash_attention.cu) for wide prompt
// tiles and narrow decode tiles split across blocks where it has the
// head_dim (64, 128); fp8 (engine/backend/kv_fp8.h) through its fp8 tile loader
// (fp8_kv_tile.cuh), fed by QkvPost, LaunchKvQuantizeFp8 and, after
// attention, LaunchKvStoreFp8, and the portable narrow-tile kernel of
// fp8_kv.cu for other head_dims. What only bf16 has: the warpgroup
// prompt kernel and its TMA page copies, and the decode attention that
// applies the rotary and stores bf16 K/V itself. Pure functions (host and
// device), tested without a GPU.
#pragma once

namespace agentkv::backend::cuda::kernels {

// The most key splits LaunchAttention takes (its split merge's widest
// form). Steps plan at most 32 but decode on the forms whose blocks per SM
// are known (step_plan.h's DecodeWaveBlocks: the lean fp8 form, the bf16
// one), whose single-sequence grids need more blocks to fill the SMs.
inline constexpr int kMaxAttentionSplits = 64;

// Wide (64-row) attention tiles: steps with prompt chunks, where the
// head_dim has them (WideAttentionSupported: the mma.sync kernel's, which
// reads both caches).
inline bool RouteWideTiles(bool decode, bool wide_supported) { return !decode && wide_supported; }

// The kernel of an fp8 step's attention: the mma.sync kernel where it has
// the head_dim, for wide tiles always, for narrow ones unless mma.sync
// attention is turned off (CudaTuning::mma_attention, for comparison);
// false: the portable kernel (narrow tiles only).
inline bool RouteFp8Mma(bool wide, bool mma_enabled, bool mma_supported) {
  return mma_supported && (wide || mma_enabled);
}

// The same for a bf16 step: true for the mma.sync kernel (which hands wide
// tiles at head_dim 64 on to the warpgroup kernel where that is on), for
// wide tiles always (only head_dims it has get them), for narrow ones where
// it has the head_dim unless mma.sync attention is turned off; false: the
// portable kernel.
inline bool RouteBf16Mma(bool wide, bool mma_enabled, bool mma_supported) {
  return wide || (mma_enabled && mma_supported);
}

// The decode attention that applies the rotary and stores the token's K and
// V itself (bf16 rows): one token per sequence, narrow tiles, enabled and
// supported for the head_dim; never with fp8.
inline bool RouteFusedRotary(bool fp8, bool enabled, bool one_token_per_seq, bool wide,
                             bool supported) {
  return !fp8 && enabled && one_token_per_seq && !wide && supported;
}

// The warpgroup kernel's TMA page copies (bf16 pages only).
inline bool RouteKvMap(bool fp8, bool wide, bool fused_store, bool ring, bool map_ok) {
  return !fp8 && wide && fused_store && !ring && map_ok;
}

// Whether the step's K and V go to the cache before attention (QkvPost
// storing them) rather than after it: only for bf16, where no query of the
// step still needs a ring slot they overwrite. fp8 always stores after
// attention, from the quantized rows attention read.
inline bool RouteStoreBeforeAttention(bool fp8, bool ring, bool one_token_per_seq) {
  return !fp8 && (!ring || one_token_per_seq);
}

}  // namespace agentkv::backend::cuda::kernels
