#include "engine/pick_mode.h"

#include "engine/backend/row_logprobs.h"

namespace agentkv::engine {

static_assert(backend::kMaxRowLogprobs == SamplingParams::kMaxLogprobs,
              "a backend's RowLogprobs holds every top entry a request may ask for");

backend::PickMode ChoosePickMode(const SamplingParams& p, bool device_logprobs) {
  // Constrained rows are masked by the Sampler on the host.
  if (p.has_penalties() || p.grammar || (p.logprobs && !device_logprobs))
    return backend::PickMode::kHost;
  return p.greedy() ? backend::PickMode::kGreedy : backend::PickMode::kDevice;
}

bool UseOptimisticGrammar(OptimisticGrammar mode, bool reads_kept_logits, bool picks_on_device) {
  if (mode == OptimisticGrammar::kOff || !reads_kept_logits) return false;
  return mode == OptimisticGrammar::kOn || picks_on_device;
}

bool OptimisticGrammarPick(const SamplingParams& p) {
  if (!p.grammar || p.has_penalties() || p.logprobs) return false;
  if (p.greedy()) return true;
  return p.top_k <= 0 && p.top_p >= 1.0f && p.min_p <= 0.0f;
}

backend::RowPick PlanRowPick(const SamplingParams& p, bool device_logprobs, bool kept_logits) {
  backend::RowPick r;
  if (kept_logits && OptimisticGrammarPick(p)) {
    r.mode = p.greedy() ? backend::PickMode::kGreedy : backend::PickMode::kDevice;
    r.keep_logits = 1;
    return r;
  }
  r.mode = ChoosePickMode(p, device_logprobs);
  if (r.mode != backend::PickMode::kHost && p.logprobs)
    r.logprobs = static_cast<int8_t>(*p.logprobs);
  return r;
}

bool RowPipelines(const backend::RowPick& pick, bool kept_rows_in_flight) {
  if (pick.mode == backend::PickMode::kHost) return false;
  return pick.keep_logits == 0 || kept_rows_in_flight;
}

}  // namespace agentkv::engine
