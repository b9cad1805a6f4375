#include "engine/pick_mode.h"

namespace agentkv {

PickMode ChoosePickMode(const SamplingParams& p) {
  if (p.has_penalties() || p.logprobs) return PickMode::kHost;
  return p.greedy() ? PickMode::kGreedy : PickMode::kDevice;
}

}  // namespace agentkv
