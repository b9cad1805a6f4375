#include "engine/draft_policy.h"

#include <algorithm>

namespace agentkv::engine {

bool SpeculationEligible(const SpeculativeOptions& options, const SamplingParams& params) {
  return options.mode != SpeculativeMode::kNone && options.max_draft > 0 && params.speculative &&
         !params.grammar && !params.logprobs && !params.has_penalties();
}

int StepDraftBudget(const SpeculativeOptions& options, int decoding, int64_t prefill_tokens) {
  if (options.mode == SpeculativeMode::kNone || prefill_tokens > 0 || decoding <= 0) return 0;
  return std::max(0, options.compute_bound_tokens - decoding);
}

DraftLength::DraftLength(int max_draft)
    : max_draft_(std::max(max_draft, 0)), current_(std::min(4, max_draft_)) {}

int DraftLength::Next() {
  if (paused_ > 0) {
    --paused_;
    if (paused_ == 0) current_ = std::min(1, max_draft_);
    return 0;
  }
  return current_;
}

void DraftLength::Update(int drafted, int accepted) {
  if (drafted <= 0) return;
  accepted = std::clamp(accepted, 0, drafted);
  if (accepted == drafted) {
    current_ = std::min(max_draft_, std::max(1, current_) * 2);
    misses_ = 0;
    return;
  }
  current_ = std::min(max_draft_, accepted + 1);
  if (accepted > 0) {
    misses_ = 0;
    return;
  }
  if (++misses_ >= kMissesToPause) {
    misses_ = 0;
    paused_ = kPauseSteps;
  }
}

}  // namespace agentkv::engine
