// Speculative decoding from the context: its options and the decisions how
// much to draft (pure functions and a small per-sequence state, callable
// without a backend).
//
//   SpeculationEligible: which requests may be drafted for at all.
//   DraftLength: a sequence's draft length, adapted to its acceptance.
//   StepDraftBudget: how many draft tokens one step may carry, turned down
//     to nothing when the step is compute-bound (many sequences decoding,
//     or prefill in the step), where verifying drafts costs more than it
//     saves.
//
// Thread-safety: the functions are pure; a DraftLength belongs to one
// sequence (the engine thread).
#pragma once

#include <cstdint>

#include "engine/ngram_draft.h"
#include "engine/sampling_params.h"

namespace agentkv::engine {

enum class SpeculativeMode { kNone, kNgram };

struct SpeculativeOptions {
  SpeculativeMode mode = SpeculativeMode::kNone;
  // The longest draft of one sequence in one step. Kept below the KV block
  // size (the engine clamps it): a rejected draft's K/V is written into the
  // sequence's blocks before it is known to be rejected, and a sliding
  // window's ring (window + one block) has room for that only below a block.
  int max_draft = 8;
  // Drafting only while a step (decode tokens, prefill and drafts) stays
  // under this many tokens: below it a step's time is dominated by reading
  // the weights, so verifying a few more tokens is nearly free; above it the
  // step is compute-bound and drafts would lower batch throughput. A
  // conservative start until measured per device.
  int compute_bound_tokens = 32;
  NgramDraftOptions ngram;
};

// Whether a request may be drafted for: speculation on, the request did not
// opt out (params.speculative), and its rows need nothing but the logits of
// each position (no grammar mask, no logprobs, no penalties: each of those
// would need the Sampler's state advanced per draft position).
bool SpeculationEligible(const SpeculativeOptions& options, const SamplingParams& params);

// Draft tokens the step may carry in all: 0 when any prefill is in the step
// or `decoding` (sequences decoding one token each) already reaches
// compute_bound_tokens; else the room up to it. Pure.
int StepDraftBudget(const SpeculativeOptions& options, int decoding, int64_t prefill_tokens);

// One sequence's adaptive draft length. Starts at min(4, max_draft). A
// fully accepted draft doubles it (up to max_draft); a partly accepted one
// sets it to the accepted count plus one, so the next draft is about as
// long as the run the model just confirmed. When nothing is accepted
// kMissesToPause times in a row, drafting pauses for kPauseSteps steps and
// then resumes at length 1: text the context does not predict costs one
// wasted token per step at most while it lasts.
class DraftLength {
 public:
  static constexpr int kMissesToPause = 3;
  static constexpr int kPauseSteps = 16;

  explicit DraftLength(int max_draft);
  // Tokens to draft this step (0: pausing); counts a paused step.
  int Next();
  // The outcome of a verified draft of `drafted` tokens (> 0).
  void Update(int drafted, int accepted);
  int current() const { return current_; }

 private:
  int max_draft_;
  int current_;
  int misses_ = 0;
  int paused_ = 0;
};

}  // namespace agentkv::engine
