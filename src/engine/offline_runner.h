// OfflineRunner: runs a fixed set of generation requests to completion on one
// backend with continuous batching: up to `max_batch` sequences run at once,
// each step mixes decode tokens with chunked prefill under a token budget,
// and a waiting request joins as soon as a running one finishes.
//
// It is the engine loop of the command-line tools (`generate`, `bench
// engine`); the server's scheduler adds priorities, preemption, the prefix
// cache and streaming to other threads on top of the same backend interface.
//
// Thread-safety: not thread-safe; runs on the calling thread, which must own
// the backend for the duration of Run().
#pragma once

#include <functional>
#include <vector>

#include "engine/backend.h"
#include "engine/sampling_params.h"

namespace agentkv {

struct GenRequest {
  std::vector<int32_t> prompt;  // at least one token
  SamplingParams params;        // must have passed Validate()
};

struct GenResult {
  std::vector<int32_t> output;  // generated tokens, the stop token excluded
  std::string finish_reason;    // "stop" (EOS / stop token) or "length"
  double ttft_s = 0;            // submission to first token
  double total_s = 0;           // submission to last token
};

struct OfflineRunnerOptions {
  int max_batch = 8;          // sequences running at once
  int max_step_tokens = 512;  // tokens (prefill + decode) per step
  int block_size = 16;
  // Blocks per cache group; 0 = enough for max_batch sequences of
  // `max_context` tokens.
  int32_t blocks_per_group = 0;
  int32_t max_context = 4096;
};

class OfflineRunner {
 public:
  // Called after each sampled token that is part of the output.
  using TokenCallback = std::function<void(size_t request, int32_t token)>;

  OfflineRunner(Backend& backend, std::vector<int32_t> eos_ids, OfflineRunnerOptions options);

  // Allocates the backend's KV storage (once) and runs every request. A
  // prompt longer than max_context, or a token out of range, is
  // InvalidArgument before anything runs.
  Result<std::vector<GenResult>> Run(const std::vector<GenRequest>& requests,
                                     const TokenCallback& on_token = nullptr);

  // Steps and tokens of the last Run, for benchmarks.
  int64_t steps() const { return steps_; }

 private:
  Backend& backend_;
  std::vector<int32_t> eos_ids_;
  OfflineRunnerOptions options_;
  bool allocated_ = false;
  int64_t steps_ = 0;
};

}  // namespace agentkv
