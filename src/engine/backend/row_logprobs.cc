#include "engine/backend/row_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace agentkv::backend {

RowLogprobs ComputeRowLogprobs(const float* logits, int32_t vocab, double scale, int32_t want,
                               int32_t chosen) {
  RowLogprobs r;
  want = std::clamp<int32_t>(want, 0, std::min<int32_t>(kMaxRowLogprobs, vocab));
  float m = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) m = std::max(m, logits[i]);
  if (m > -std::numeric_limits<float>::infinity()) {
    const double ms = static_cast<double>(m) * scale;
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; ++i) {
      if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) * scale - ms);
    }
    r.lse = ms + std::log(sum);
  }
  // Insertion into a sorted array; ids scanned in ascending order with a
  // strict comparison keep the lowest id first on ties.
  float v_top[kMaxRowLogprobs];
  for (int32_t i = 0; i < vocab && want > 0; ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (r.count == want && !(v > v_top[want - 1])) continue;
    int32_t pos = r.count < want ? r.count++ : want - 1;
    while (pos > 0 && v > v_top[pos - 1]) {
      v_top[pos] = v_top[pos - 1];
      r.ids[pos] = r.ids[pos - 1];
      --pos;
    }
    v_top[pos] = v;
    r.ids[pos] = i;
  }
  for (int32_t k = 0; k < r.count; ++k)
    r.logprobs[k] = static_cast<float>(static_cast<double>(v_top[k]) * scale - r.lse);
  // A NaN logit is no token (left out of the sum above): its logprob is -inf.
  if (chosen >= 0 && chosen < vocab) {
    r.chosen = std::isnan(logits[chosen])
                   ? -std::numeric_limits<float>::infinity()
                   : static_cast<float>(static_cast<double>(logits[chosen]) * scale - r.lse);
  }
  return r;
}

}  // namespace agentkv::backend
