// Which attention path a step takes, given the KV cache dtype: the bf16
// cache has the fast paths (wide warpgroup / mma.sync prompt tiles, TMA page
// copies, decode attention that applies the rotary and stores K/V itself);
// the fp8 cache (engine/kv_fp8.h) has one portable kernel over narrow tiles
// fed by QkvPost, LaunchKvQuantizeFp8 and, after attention,
// LaunchKvStoreFp8, so every fp8 step is routed away from the bf16-only
// kernels. Pure functions (host and device), tested without a GPU.
#pragma once

namespace agentkv::cuda {

// Wide (64-row) attention tiles: steps with prompt chunks, where the
// head_dim has them, and never with fp8.
inline bool RouteWideTiles(bool fp8, bool decode, bool wide_supported) {
  return !fp8 && !decode && wide_supported;
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

}  // namespace agentkv::cuda
