// RowPick: how the backend picks one logits row's token in a step (plans as
// data: the engine fills one per want_logits row, the backend executes it).
// Plain C++17 (the CUDA kernels read the same struct from device memory).
//
//   kHost:   the backend copies the row's logits to the host; the engine's
//            Sampler picks (penalties, logprobs).
//   kGreedy: argmax, lowest id on ties, NaN never wins.
//   kDevice: a draw from the distribution `sample` describes, made where
//            the logits are (on a GPU: no logits copy), exactly as SampleDraw
//            (engine/backend/sample_draw.h) defines it.
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
};

}  // namespace agentkv::backend
