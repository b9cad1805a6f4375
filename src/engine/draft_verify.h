// Verifying a speculative draft: a sequence that ran its last token and k
// draft tokens d[0..k) in one step has k + 1 logits rows; row j is the
// distribution after d[0..j). These turn the rows into the tokens a
// non-speculative run would have produced (greedy), or tokens from the same
// distribution (sampled).
//
//   Greedy: the longest prefix of the draft where d[j] == argmax(row j) is
//     accepted, then the argmax of the first row that disagrees (or of the
//     last row, the bonus token): exactly the tokens k + 1 greedy steps would
//     give.
//   Sampled: standard speculative rejection sampling for a deterministic
//     draft (the draft distribution puts all mass on d[j]): d[j] is accepted
//     with probability p_j(d[j]), p_j the distribution SampleDraw draws from
//     row j (temperature, top_k, top_p, min_p); the first rejected position
//     draws from p_j with d[j] removed and renormalised; when all are
//     accepted, the last row is drawn as usual. Each emitted token is then
//     distributed as a plain draw from its row would be.
//
// Pure (the uniforms come from the caller); thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "engine/backend/row_pick.h"

namespace agentkv::engine {

struct DraftVerdict {
  int accepted = 0;  // leading draft tokens kept
  int32_t next = 0;  // the token after them (correction or bonus)
};

// `picks` holds argmax(row j) for j = 0..k (draft.size() + 1 entries).
DraftVerdict VerifyGreedyDraft(std::span<const int32_t> draft, std::span<const int32_t> picks);

// `logits`: draft.size() + 1 rows of `vocab` floats (clobbered).
// `settings`: the draw's settings (u unused). `uniform` gives a fresh u in
// [0, 1) each call (one per accept test, one per draw; a seeded request's
// Sampler::NextDraw().u).
DraftVerdict VerifySampledDraft(std::span<const int32_t> draft, std::span<float> logits,
                                int32_t vocab, const backend::SampleSettings& settings,
                                const std::function<double()>& uniform);

}  // namespace agentkv::engine
