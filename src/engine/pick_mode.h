// ChoosePickMode: the decision which rows of a sequence the backend may pick
// itself (RowPick, engine/backend/row_pick.h) and which the engine's Sampler picks.
// Pure; thread-safe.
#pragma once

#include "engine/backend/row_pick.h"
#include "engine/sampling_params.h"

namespace agentkv {

// How a sequence's rows are picked: kGreedy for temperature 0 without
// penalties or logprobs; kDevice for temperature > 0 without penalties or
// logprobs (only temperature, top_k, top_p, min_p shape the draw); kHost
// otherwise (the Sampler needs the whole logits row: penalties, logprobs, a
// grammar). Pure.
PickMode ChoosePickMode(const SamplingParams& params);
inline bool DeviceSamplable(const SamplingParams& params) {
  return ChoosePickMode(params) == PickMode::kDevice;
}

}  // namespace agentkv
