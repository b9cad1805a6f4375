// RowLogprobs: one logits row's logprobs as a backend computes them next to
// the logits (the CUDA kernel in cuda/kernels/logprob_kernel.cu), so that a
// row asking for logprobs need not be copied to the host whole. Plain
// C++17 (the kernels write the same struct).
//
// Definition (SamplingParams::logprobs's): with s = 1 / temperature for a
// drawn row (PickMode::kDevice) and s = 1 for a greedy one, and lse the
// log-sum-exp of s * logit over the row's non-NaN logits (0 when every
// logit is -inf or NaN), a token's logprob is s * logit - lse. The top
// entries are the `want` largest logits (NaN never; lowest id first on
// ties), most likely first; `chosen` is the picked token's logprob.
#pragma once

#include <cstdint>

namespace agentkv::backend {

// Most top entries a row may ask for (SamplingParams::kMaxLogprobs).
inline constexpr int kMaxRowLogprobs = 20;

struct RowLogprobs {
  int32_t count = 0;    // top entries written: min(want, vocab)
  float chosen = 0.0f;  // the picked token's logprob
  double lse = 0.0;     // log-sum-exp of the scaled logits
  int32_t ids[kMaxRowLogprobs] = {};
  float logprobs[kMaxRowLogprobs] = {};
};

// The CPU reference of the definition above for one row of `vocab` logits:
// `scale` is s, `want` in [0, kMaxRowLogprobs], `chosen` the picked id
// (outside [0, vocab): `chosen` is left 0; a NaN logit there: -inf). Sums run in double in id
// order. Pure; thread-safe.
RowLogprobs ComputeRowLogprobs(const float* logits, int32_t vocab, double scale, int32_t want,
                               int32_t chosen);

}  // namespace agentkv::backend
