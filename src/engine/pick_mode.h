// ChoosePickMode: the decision which rows of a sequence the backend may pick
// itself (RowPick, engine/backend/row_pick.h) and which the engine's Sampler picks.
// Pure; thread-safe.
#pragma once

#include "engine/backend/row_pick.h"
#include "engine/sampling_params.h"

namespace agentkv::engine {

// How a sequence's rows are picked: kGreedy for temperature 0 without
// penalties or logprobs; kDevice for temperature > 0 without penalties or
// logprobs (only temperature, top_k, top_p, min_p shape the draw); kHost
// otherwise (the Sampler needs the whole logits row: penalties, a grammar's
// mask, logprobs without `device_logprobs`). With
// `device_logprobs` (the backend computes RowLogprobs next to its picks),
// rows asking for logprobs without penalties are kGreedy / kDevice too.
// Pure.
backend::PickMode ChoosePickMode(const SamplingParams& params, bool device_logprobs = false);

// The whole plan of one row: its mode, and for a row the backend picks
// with logprobs, RowPick::logprobs (the top entries asked). The draw's
// settings (RowPick::sample) come from the Sampler at launch. Pure.
backend::RowPick PlanRowPick(const SamplingParams& params, bool device_logprobs = false);
inline bool DeviceSamplable(const SamplingParams& params) {
  return ChoosePickMode(params) == backend::PickMode::kDevice;
}

}  // namespace agentkv::engine
