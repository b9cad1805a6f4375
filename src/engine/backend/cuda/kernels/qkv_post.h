// After the QKV projection: bias, per-head q/k norms and the rotary
// embedding (QkvPost), and the bf16 KV cache store (qkv_post.cu); launch.h
// says what all launchers share. The fp8 cache's quantize and store are in
// fp8_kv.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// Per token: qkv rows [q heads | k heads | v heads] * head_dim (fp32, the
// GEMM output) plus `bias` (or null); per-head RMSNorm of q and k by q_norm /
// k_norm (null: none); rotary embedding (rotate-half) at pos[t] with
// inv_freq[head_dim / 2], cos and sin multiplied by rope_factor (YaRN's
// attention factor, kernels::RopeAttentionFactor; 1 for other ropes).
// Writes q [T][nh][D], k and v [T][nkv][D] in bf16.
// TIn: float, or bf16_t (prefill steps: the GEMM's output rounded to bf16,
// as a bf16 model's Linear leaves it; half the bytes of the fp32 form to
// write and read). Instantiated for those two.
template <typename TIn>
cudaError_t LaunchQkvPost(const TIn* qkv, const float* bias, const float* q_norm,
                          const float* k_norm, const float* inv_freq, float rope_factor,
                          const int32_t* pos, int tokens, int nh, int nkv, int head_dim, float eps,
                          bool plus_one, bf16_t* q, bf16_t* k, bf16_t* v, LaunchConfig launch);

// Where one layer's K and V live in a group's paged cache: per block, for
// each layer of the group, K then V, each [block_size][nkv][head_dim] bf16.
// fp8: K then V are each a section of [block_size][nkv][head_dim] e4m3
// bytes followed by [block_size][nkv] f32 scales (engine/backend/kv_fp8.h), and
// base, block_stride and layer_offset count bytes.
struct KvCacheView {
  bf16_t* base = nullptr;    // the group's block 0
  int64_t block_stride = 0;  // elements per block (all layers of the group)
  int64_t layer_offset = 0;  // elements to this layer's K within a block
  bool fp8 = false;
  int block_size = 16;
  int ring = 0;                     // sliding groups: ring blocks; 0 for full
  const int32_t* tables = nullptr;  // [seq][*table_stride] block ids
  // One device int: the row stride of `tables`. Read on the device so that a
  // captured graph stays valid as the tables widen.
  const int32_t* table_stride = nullptr;
};

// LaunchQkvPost that also stores k and v into the paged cache, as
// LaunchKvStore would (tokens with pos < 0 skipped). Only where no query of
// the step still needs a cache slot it overwrites: full-attention groups, or
// steps of one token per sequence. k and v may be null for a bf16 projection
// at head_dim 64 (the cache alone gets K and V; see AttentionReadsCacheOnly);
// elsewhere null k or v is an invalid value.
template <typename TIn>
cudaError_t LaunchQkvPostStore(const TIn* qkv, const float* bias, const float* q_norm,
                               const float* k_norm, const float* inv_freq, float rope_factor,
                               const int32_t* pos, const int32_t* tok_seq, int tokens, int nh,
                               int nkv, int head_dim, float eps, bool plus_one, bf16_t* q,
                               bf16_t* k, bf16_t* v, const KvCacheView& cache, LaunchConfig launch);

// Stores this step's K and V (bf16 [T][nkv][D]) into the cache at pos[t] of
// sequence tok_seq[t]; tokens with pos < 0 (padding) are skipped. In a ring,
// where several of a sequence's tokens this step share a slot, the newest
// one is kept (sequence s's step ends at seq_start[s] + seq_first[s + 1] -
// seq_first[s]).
cudaError_t LaunchKvStore(const bf16_t* k, const bf16_t* v, const int32_t* pos,
                          const int32_t* tok_seq, const int32_t* seq_start,
                          const int32_t* seq_first, int tokens, int nkv, int head_dim,
                          const KvCacheView& cache, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
