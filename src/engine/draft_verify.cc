#include "engine/draft_verify.h"

#include "engine/backend/sample_draw.h"

namespace agentkv::engine {

DraftVerdict VerifyGreedyDraft(std::span<const int32_t> draft, std::span<const int32_t> picks) {
  DraftVerdict v;
  while (static_cast<size_t>(v.accepted) < draft.size() &&
         static_cast<size_t>(v.accepted) + 1 < picks.size() &&
         draft[static_cast<size_t>(v.accepted)] == picks[static_cast<size_t>(v.accepted)])
    ++v.accepted;
  v.next = picks[static_cast<size_t>(v.accepted)];
  return v;
}

DraftVerdict VerifySampledDraft(std::span<const int32_t> draft, std::span<float> logits,
                                int32_t vocab, const backend::SampleSettings& settings,
                                const std::function<double()>& uniform) {
  DraftVerdict v;
  const size_t n = static_cast<size_t>(vocab);
  for (size_t j = 0; j < draft.size(); ++j) {
    const std::span<float> row = logits.subspan(j * n, n);
    const int32_t d = draft[j];
    const int32_t point = backend::SampleWeights(row, settings);
    if (point >= 0) {
      // The row's distribution is a single token: accepted iff it is d.
      if (point == d) {
        ++v.accepted;
        continue;
      }
      v.next = point;
      return v;
    }
    double mass = 0.0;
    for (float w : row) mass += w;
    const double p = (d >= 0 && d < vocab) ? row[static_cast<size_t>(d)] / mass : 0.0;
    if (uniform() < p) {
      ++v.accepted;
      continue;
    }
    // Rejected: draw from the residual max(0, p - q), q the point mass on d,
    // which is p with d removed.
    if (d >= 0 && d < vocab) row[static_cast<size_t>(d)] = 0.0f;
    const int32_t t = backend::DrawFromWeights(row, uniform());
    v.next = t >= 0 ? t : d;  // nothing left only if p(d) rounded below 1
    return v;
  }
  backend::SampleSettings last = settings;
  last.u = uniform();
  v.next = backend::SampleDraw(logits.subspan(draft.size() * n, n), last);
  return v;
}

}  // namespace agentkv::engine
