// Where QkvPost puts each head of a token: its q, k or v row, its copy in
// the paged cache, its norm weights. Shared by the generic and the
// head_dim-specialised QkvPost kernels; host and device (the host test
// checks the arithmetic without a GPU). Pointers are only computed here,
// never dereferenced, except the cache table entry CacheRow reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {

// Token t's K row in the paged cache (its V row follows block_size * nkv *
// D elements on), or null: no cache (tok_seq null) or a padding token
// (pos < 0).
__host__ __device__ inline bf16_t* CacheRow(const KvCacheView& c, const int32_t* tok_seq, int t,
                                            int pos, int nkv, int D) {
  if (tok_seq == nullptr || pos < 0) return nullptr;
  const int lb = pos / c.block_size;
  const int64_t blk = c.tables[static_cast<int64_t>(tok_seq[t]) * *c.table_stride +
                               (c.ring > 0 ? lb % c.ring : lb)];
  return c.base + blk * c.block_stride + c.layer_offset +
         static_cast<int64_t>(pos % c.block_size) * nkv * D;
}

struct HeadRoute {
  bf16_t* dst;        // the head's row of q, k or v
  bf16_t* cache;      // its row in the cache (k and v heads with a cache), or null
  const float* norm;  // q_norm, k_norm (either may be null) or null for v
  bool rotary;        // q and k heads
};

// Head hh (q heads first, then k, then v) of token t; ck: CacheRow's result.
__host__ __device__ inline HeadRoute RouteHead(int hh, int t, int nh, int nkv, int D,
                                               int block_size, bf16_t* q, bf16_t* k, bf16_t* v,
                                               const float* q_norm, const float* k_norm,
                                               bf16_t* ck) {
  if (hh < nh) return {q + (static_cast<int64_t>(t) * nh + hh) * D, nullptr, q_norm, true};
  const bool is_k = hh < nh + nkv;
  const int kv = is_k ? hh - nh : hh - nh - nkv;
  bf16_t* cache = nullptr;
  if (ck != nullptr)
    cache =
        ck + (is_k ? 0 : static_cast<int64_t>(block_size) * nkv * D) + static_cast<int64_t>(kv) * D;
  if (is_k) return {k + (static_cast<int64_t>(t) * nkv + kv) * D, cache, k_norm, true};
  return {v + (static_cast<int64_t>(t) * nkv + kv) * D, cache, nullptr, false};
}

}  // namespace agentkv::backend::cuda::kernels
