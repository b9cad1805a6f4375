// The fp8 (e4m3) KV cache's launchers (fp8_kv.cu): a step's K and V rows
// quantized, and stored into the paged cache. (Its attention runs through
// LaunchAttention, attention.h.) launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kernels/qkv_post.h"

namespace agentkv::backend::cuda::kernels {

// The fp8 cache's path. A step's K and V rows quantized as the cache holds
// them ([T][nkv][head_dim] e4m3 bytes and [T][nkv] f32 scales each),
// between QkvPost and the store: attention reads the step's own keys from
// here, so that they are the values later steps will read from the cache.
struct Fp8KvRows {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};
// Bytes Fp8KvRows needs for `tokens` tokens, and the rows laid out in
// `base` (k bytes, v bytes, k scales, v scales; head_dim a multiple of 16).
inline size_t Fp8KvRowsBytes(int64_t tokens, int nkv, int head_dim) {
  return static_cast<size_t>(tokens) * nkv * (head_dim + 4) * 2;
}
inline Fp8KvRows Fp8KvRowsAt(void* base, int64_t tokens, int nkv, int head_dim) {
  auto* b = static_cast<uint8_t*>(base);
  const int64_t n = tokens * nkv;
  Fp8KvRows r;
  r.k = b;
  r.v = b + n * head_dim;
  r.k_scale = reinterpret_cast<float*>(b + 2 * n * head_dim);
  r.v_scale = r.k_scale + n;
  return r;
}
// Quantizes k and v (bf16 [T][nkv][D], QkvPost's) row by row into `rows`
// as engine/backend/kv_fp8.h's QuantizeRow does (bit for bit on the same values);
// tokens with pos < 0 (padding) are skipped.
cudaError_t LaunchKvQuantizeFp8(const bf16_t* k, const bf16_t* v, const int32_t* pos, int tokens,
                                int nkv, int head_dim, Fp8KvRows rows, LaunchConfig launch);
// Stores `rows` into the fp8 cache (cache.fp8) as LaunchKvStore stores bf16
// rows (pos < 0 skipped; in a ring the newest token of a slot wins).
cudaError_t LaunchKvStoreFp8(Fp8KvRows rows, const int32_t* pos, const int32_t* tok_seq,
                             const int32_t* seq_start, const int32_t* seq_first, int tokens,
                             int nkv, int head_dim, const KvCacheView& cache, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
