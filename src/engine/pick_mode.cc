#include "engine/pick_mode.h"

#include "engine/backend/row_logprobs.h"

namespace agentkv {

static_assert(kMaxRowLogprobs == SamplingParams::kMaxLogprobs,
              "a backend's RowLogprobs holds every top entry a request may ask for");

PickMode ChoosePickMode(const SamplingParams& p, bool device_logprobs) {
  // Constrained rows are masked by the Sampler on the host.
  if (p.has_penalties() || p.grammar || (p.logprobs && !device_logprobs)) return PickMode::kHost;
  return p.greedy() ? PickMode::kGreedy : PickMode::kDevice;
}

RowPick PlanRowPick(const SamplingParams& p, bool device_logprobs) {
  RowPick r;
  r.mode = ChoosePickMode(p, device_logprobs);
  if (r.mode != PickMode::kHost && p.logprobs) r.logprobs = static_cast<int8_t>(*p.logprobs);
  return r;
}

}  // namespace agentkv
