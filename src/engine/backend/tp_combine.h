// Combining per-rank results over a vocabulary split (tensor parallelism,
// tp_plan.h) without gathering the logits:
// - greedy picks: each rank packs its best (logit, global token id) into a
//   64-bit key whose unsigned order is the argmax's (larger logit first,
//   then the lower id), so one max all-reduce of one key per row gives
//   every rank the global argmax;
// - log-sum-exp (logprobs, sampling normalisers): each rank's (max, sum of
//   exp(logit - max)) combine into the global one.
// Host and device code (the CUDA kernels include this header).
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define AGENTKV_TP_HD __host__ __device__
#else
#define AGENTKV_TP_HD
#endif

namespace agentkv::backend::tp {

// The float's bits mapped so that unsigned order is numeric order
// (-inf lowest, +inf highest); NaN ranks below -inf (never picked over a
// number).
AGENTKV_TP_HD inline uint32_t OrderedBits(float v) {
  if (v != v) return 0;  // NaN
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(v);
#else
  std::memcpy(&u, &v, 4);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The key of token `id` (global, below 2^32 - 1) with logit `v`.
AGENTKV_TP_HD inline uint64_t ArgmaxKey(float v, int64_t id) {
  return (static_cast<uint64_t>(OrderedBits(v)) << 32) |
         static_cast<uint64_t>(0xffffffffu - static_cast<uint32_t>(id));
}

// The token id of a key.
AGENTKV_TP_HD inline int32_t ArgmaxKeyId(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu));
}

// One rank's share of a log-sum-exp: max and sum of exp(logit - max) over
// its slice (max -inf and sum 0 for an empty one).
struct LseShare {
  float max = -INFINITY;
  float sum = 0.f;
};

// Adds share `b` into `a` (associative; the result is the union's share).
AGENTKV_TP_HD inline LseShare CombineLse(LseShare a, LseShare b) {
  if (b.max == -INFINITY) return a;
  if (a.max == -INFINITY) return b;
  const float m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// log(sum(exp(logits))) of a combined share.
AGENTKV_TP_HD inline float LogSumExp(LseShare s) { return s.max + logf(s.sum); }

}  // namespace agentkv::backend::tp
