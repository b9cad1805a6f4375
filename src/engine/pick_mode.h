// ChoosePickMode: the decision which rows of a sequence the backend may pick
// itself (RowPick, engine/backend/row_pick.h) and which the engine's Sampler picks.
// Pure; thread-safe.
#pragma once

#include <cstdint>

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

// Whether a grammar-constrained row may be picked optimistically: the
// backend picks from the unmasked row as for an unconstrained one
// (kGreedy / kDevice, RowPick::keep_logits), the host checks only that
// token against the grammar (Sampler::AcceptPick), and only when the
// grammar rejects it is the kept row masked and picked on the host
// (Sampler::Sample, with a fresh uniform for a draw). The same
// distribution as masking first:
//   greedy: the argmax of the row, when allowed, is the argmax of the
//     allowed tokens (ties: the lowest id either way); else the masked pick;
//   temperature only: x ~ p kept when allowed, else a draw from p restricted
//     to the allowed set A, gives p(x) + (1 - p(A)) p(x) / p(A) = p(x) / p(A)
//     for x in A: exactly the masked distribution (a seeded request draws
//     one or two uniforms a token, so its tokens differ from the
//     masked-first draw's but repeat run to run).
// Not for top_k / top_p / min_p (truncating before the mask keeps other
// tokens than truncating after it), penalties (applied after the mask) or
// logprobs (of the masked distribution): those rows stay kHost. Pure.
bool OptimisticGrammarPick(const SamplingParams& params);

// EngineOptions::optimistic_grammar.
enum class OptimisticGrammar : uint8_t { kAuto, kOn, kOff };

// Whether the backend picks constrained rows optimistically (RowPick::
// keep_logits): kOn where the backend keeps logits rows
// (reads_kept_logits); kAuto only where, too, the backend's picks run off
// the host (picks_on_device: a GPU's argmax or draw and the kept row cost
// the host nothing). On the CPU backend the backend's pick is a pass over
// the whole row on the engine thread, serial, where the host's picks run
// on the sampling threads: no saving there (bench/RESULTS.md). Rows the
// backend does not pick so take the same procedure on the host unless
// kOff (Sampler::SampleOptimistic). Pure.
bool UseOptimisticGrammar(OptimisticGrammar mode, bool reads_kept_logits, bool picks_on_device);

// The whole plan of one row: its mode, and for a row the backend picks
// with logprobs, RowPick::logprobs (the top entries asked). The draw's
// settings (RowPick::sample) come from the Sampler at launch. With
// `kept_logits` (the backend honours RowPick::keep_logits), a row that
// OptimisticGrammarPick allows is kGreedy / kDevice with keep_logits. Pure.
backend::RowPick PlanRowPick(const SamplingParams& params, bool device_logprobs = false,
                             bool kept_logits = false);
// Whether the next step may launch before the step holding row `pick` is
// collected (pipelined steps; the next step's input is the backend's pick):
// a row the backend picks (kGreedy / kDevice), and a kept row
// (RowPick::keep_logits) only with `kept_rows_in_flight`: the backend
// keeps its logits readable while the next step runs
// (Backend::reads_kept_logits_in_flight) and the engine rolls the
// sequence back if the grammar rejects the pick. A kHost row never (the
// host's pick is the next step's input). Pure.
bool RowPipelines(const backend::RowPick& pick, bool kept_rows_in_flight);

inline bool DeviceSamplable(const SamplingParams& params) {
  return ChoosePickMode(params) == backend::PickMode::kDevice;
}

}  // namespace agentkv::engine
