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
//     Each row's test is independent of the others' (VerifyDraftRow, made
//     by the backend where the logits are: RowPick::draft), so a backend
//     returns one pick per row, the draft token where it was accepted, and
//     the verdict is read from the picks as the greedy one is; rows after
//     the first rejection are ignored.
//     The random stream: a drafted step of k draft tokens takes exactly
//     2k + 1 uniforms from the sequence's Sampler, whatever is accepted:
//     row j's acceptance uniform then its residual-draw uniform, for j < k,
//     then the last row's draw uniform (PlanSampledDraft). A seeded request
//     so gives the same tokens on every backend and every run.
//
// Pure (the uniforms come from the caller); thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/backend/row_pick.h"

namespace agentkv::engine {

struct DraftVerdict {
  int accepted = 0;  // leading draft tokens kept
  int32_t next = 0;  // the token after them (correction or bonus)
};

// `picks` holds row j's pick for j = 0..k (draft.size() + 1 entries): the
// argmax (greedy), or the draft token where the row accepted it and
// otherwise the residual draw (VerifyDraftRow; the last row a plain draw).
DraftVerdict VerifyGreedyDraft(std::span<const int32_t> draft, std::span<const int32_t> picks);

// The kDevice RowPicks of a sampled drafted step (draft.size() + 1 rows),
// appended to `out`: `next_draw` (a Sampler's NextDraw) is called exactly
// 2 * draft.size() + 1 times, in the order described above.
void PlanSampledDraft(std::span<const int32_t> draft,
                      const std::function<backend::SampleSettings()>& next_draw,
                      std::vector<backend::RowPick>* out);

// The CPU reference of the whole sampled verification: PlanSampledDraft
// with `settings` and `uniform` (called exactly 2 * draft.size() + 1 times)
// for the uniforms, each row picked as a backend picks it (PickDeviceRow),
// read as VerifyGreedyDraft reads picks. `logits`: draft.size() + 1 rows of
// `vocab` floats (clobbered). `settings.u` is unused.
DraftVerdict VerifySampledDraft(std::span<const int32_t> draft, std::span<float> logits,
                                int32_t vocab, const backend::SampleSettings& settings,
                                const std::function<double()>& uniform);

}  // namespace agentkv::engine
