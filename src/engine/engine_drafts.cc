// Engine's speculative decoding from the context: which running
// sequences get n-gram drafts this step and how long (ProposeDrafts), and
// the verdict on a drafted row once its step is collected (CollectDrafted).
// Members of Engine, on the engine thread like the rest of it; apart from
// engine.cc so that neither file passes ~1,000 lines.
#include <algorithm>
#include <span>
#include <vector>

#include "engine/draft_verify.h"
#include "engine/engine.h"
#include "engine/ngram_draft.h"

namespace agentkv::engine {

void Engine::ProposeDrafts() {
  int decoding = 0;
  int64_t prefill = 0;
  bool any = false;
  for (Sequence* s : scheduler_->running()) {
    s->draft.clear();
    if (s->hold) continue;
    if (s->pending() == 1) {
      ++decoding;
      any = any || (s->speculate && s->in_flight == 0);
    } else if (s->pending() > 1) {
      prefill += s->pending();
    }
  }
  if (AdmissionLikely()) ++prefill;
  if (!any) return;
  int budget = StepDraftBudget(options_.speculative, decoding, prefill);
  for (Sequence* s : scheduler_->running()) {
    if (budget <= 0) break;
    if (!s->speculate || s->hold || s->in_flight != 0 || s->pending() != 1) continue;
    const int64_t len = static_cast<int64_t>(s->tokens.size());
    // The verified output (accepted drafts plus one) stays within
    // max_tokens and the context.
    const int64_t room =
        std::min<int64_t>(s->max_new_tokens - s->output_len(), max_context_ - len) - 1;
    const int want = s->draft_length.Next();
    const int k = static_cast<int>(std::min<int64_t>({want, budget, room}));
    if (k <= 0) continue;
    s->draft = ProposeNgramDraft(s->tokens, k, options_.speculative.ngram);
    budget -= static_cast<int>(s->draft.size());
  }
}

bool Engine::CollectDrafted(Sequence* s, const LaunchedRow& r, int first_row,
                            std::span<float> logits) {
  // tokens: [.. last real token at r.first, draft (r.draft), placeholder].
  const int32_t vocab = backend_->config().vocab_size;
  const std::vector<int32_t> draft(s->tokens.begin() + r.first + 1,
                                   s->tokens.begin() + r.first + 1 + r.draft);
  DraftVerdict v;
  if (r.backend_pick) {
    // Greedy: argmaxes; sampled: the backend's VerifyDraftRow picks.
    v = VerifyGreedyDraft(draft, std::span<const int32_t>(picks_buf_)
                                     .subspan(static_cast<size_t>(first_row), draft.size() + 1));
  } else {
    const std::span<float> rows(logits.data() + static_cast<int64_t>(first_row) * vocab,
                                (draft.size() + 1) * static_cast<size_t>(vocab));
    // The same 2k + 1 uniforms, in the same order, as a backend's picks.
    const backend::SampleSettings settings = s->sampler->NextDraw();
    bool first_u = true;
    v = VerifySampledDraft(draft, rows, vocab, settings, [&] {
      if (first_u) {  // the one NextDraw above drew
        first_u = false;
        return settings.u;
      }
      return s->sampler->NextDraw().u;
    });
  }
  local_.draft_tokens += r.draft;
  local_.draft_accepted_tokens += v.accepted;
  s->draft_length.Update(r.draft, v.accepted);
  // The real tokens: the last one, the accepted drafts, the next token. Only
  // the verified ones' K/V is committed (the rejected positions' K/V stays in
  // the blocks uncommitted, overwritten by the next steps; never hashed
  // into the prefix cache).
  const int64_t verified = r.first + 1 + v.accepted;
  s->tokens.resize(static_cast<size_t>(verified));
  s->tokens.push_back(v.next);
  s->in_flight = 0;
  s->hold = false;
  s->computed = verified;
  if (Status c = kv_->CommitTokens(
          s->id, std::span<const int32_t>(s->tokens).subspan(r.first, 1 + v.accepted));
      !c.ok()) {
    std::unique_ptr<Sequence> gone = scheduler_->Remove(s->id);
    Fail(gone.get(), c);
    return false;
  }
  for (int64_t at = r.first + 1; at <= verified; ++at) {
    const int32_t tok = s->tokens[static_cast<size_t>(at)];
    s->sampler->AddOutput(tok);
    if (EmitToken(s, tok, at, nullptr, nullptr)) return true;
  }
  return false;
}

}  // namespace agentkv::engine
