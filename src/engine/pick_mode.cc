#include "engine/pick_mode.h"

namespace agentkv {

PickMode ChoosePickMode(const SamplingParams& p) {
  // Constrained rows are masked by the Sampler on the host.
  if (p.has_penalties() || p.logprobs || p.grammar) return PickMode::kHost;
  return p.greedy() ? PickMode::kGreedy : PickMode::kDevice;
}

}  // namespace agentkv
