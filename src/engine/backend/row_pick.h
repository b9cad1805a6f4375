// RowPick: how the backend picks one logits row's token in a step (plans as
// data: the engine fills one per want_logits row, the backend executes it).
// Plain C++17 (the CUDA kernels read the same struct from device memory).
//
//   kHost:   the backend copies the row's logits to the host; the engine's
//            Sampler picks (penalties, logprobs).
//   kGreedy: argmax, lowest id on ties, NaN never wins.
//   kDevice: a draw from the distribution `sample` describes, made where
//            the logits are (on a GPU: no logits copy), exactly as SampleDraw
//            (engine/backend/sample_draw.h) defines it; with draft >= 0, the
//            speculative test of that draft token against the distribution
//            instead (VerifyDraftRow, same header): the draft token if
//            accepted, else a draw from the residual.
//
// A kGreedy / kDevice row with keep_logits also keeps its logits where the
// backend computed them, so that the engine may still read the row back
// (Backend::ReadKeptLogits) once the step is collected: the optimistic pick
// of a grammar-constrained row (engine/pick_mode.h), which needs the row
// only when the grammar rejects the backend's pick.
#pragma once

#include <cstdint>

namespace agentkv::backend {

enum class PickMode : uint8_t { kHost = 0, kGreedy = 1, kDevice = 2 };

// The settings of one kDevice row. temperature in (0, 2], top_k <= 0 or >=
// vocab = off, top_p in (0, 1] (1 = off), min_p in [0, 1] (0 = off), u in
// [0, 1): the uniform the draw uses (from the sequence's own Sampler, so a
// seeded request draws the same sequence of u wherever it is sampled).
struct SampleSettings {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double u = 0.0;
};

struct RowPick {
  PickMode mode = PickMode::kHost;
  SampleSettings sample;  // kDevice only
  // kGreedy / kDevice rows: >= 0 asks the backend for the row's logprobs
  // with this many top entries (RowLogprobs, row_logprobs.h) next to the
  // pick; -1: none.
  int8_t logprobs = -1;
  // kDevice only. >= 0: a drafted row, verified rather than drawn: `draft`
  // is the draft token the row tests (the token that follows it in the
  // step), `u_accept` in [0, 1) the uniform of its acceptance test;
  // sample.u is the residual draw's. -1: a plain draw.
  int32_t draft = -1;
  double u_accept = 0.0;
  // kGreedy / kDevice only: 1 = the row's logits stay readable through
  // Backend::ReadKeptLogits after CollectStep (a draw works on a copy).
  uint8_t keep_logits = 0;
};

}  // namespace agentkv::backend
