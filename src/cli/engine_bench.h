// The engine-only measurement `agentkv bench engine` makes, shared with
// `agentkv bench server`, whose baseline must be the very same engine
// (SPEC section 9: a ratio's baseline runs as users get it): the options
// that shape the engine (step tokens, batch, KV memory sized for the
// requests, pipeline, prefix cache), the random requests, and one timed
// run.
//
// Thread-safety: RunEngineOnce uses the backend it is lent exclusively.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace agentkv::cli {

// The flags both commands take for the engine they measure.
struct EngineBenchOptions {
  int prompt = 128, output = 64;
  int max_step_tokens = 0;  // 0: the device's default
  int block_size = 16;
  bool no_pipeline = false;
  // EngineOptions::optimistic_grammar: auto, on or off.
  std::string optimistic_grammar = "auto";
  bool speculative = false;  // EngineOptions::speculative ngram
  // The requests' temperature (0: greedy); sampled requests are seeded
  // (seed = their index), so runs repeat. bench engine's --temperature.
  float temperature = 0.0f;
  // --prompt, --output, --max-step-tokens, --block-size, --no-pipeline,
  // --optimistic-grammar, --speculative.
  void Add(CLI::App& app);
};

// The engine of a run of `max_batch` concurrent requests of prompt + output
// tokens: room for exactly that many sequences of that length (KV sized per
// cache group), greedy pipelining unless disabled.
engine::EngineOptions BenchEngineOptions(const cache::ModelCacheSpec& spec,
                                         const EngineBenchOptions& o, int max_batch,
                                         bool prefix_caching);

// `n` requests of `o.prompt` tokens (the first `shared_prefix` the same in
// all, the rest random in [0, vocab)), greedy, EOS ignored, `o.output`
// tokens each.
std::vector<engine::EngineRequest> BenchRequests(std::mt19937_64& rng, int n,
                                                 const std::vector<int32_t>& shared_prefix,
                                                 const EngineBenchOptions& o, int32_t vocab);

struct EngineRunResult {
  double seconds = 0, mean_ttft_ms = 0, output_tok_s = 0, step_ms = 0, forward_ms = 0,
         device_ms = 0, capture_ms = 0;
  int64_t graphs_captured = 0, output_tokens = 0, steps = 0, max_batch = 0, cached_tokens = 0,
          step_tokens = 0;
  // Steps of the run replayed from captured graphs (graphs_captured counts
  // only captures inside the run: those of Reserve and the warm-up are not
  // in it, so 0 there does not mean the steps ran without graphs).
  int64_t graph_steps = 0;
  // Speculative decoding (--speculative): draft tokens verified, accepted.
  int64_t draft_tokens = 0, draft_accepted_tokens = 0;
  // Constrained rows picked optimistically, and of those rejected.
  int64_t grammar_optimistic_rows = 0, grammar_rejected_rows = 0;
  // Of the rejected, those whose sequence's next step was in flight and
  // was discarded (pipelined constrained steps).
  int64_t grammar_rolled_back_rows = 0;
  // Steps launched while the one before was in flight (EngineStats).
  int64_t pipelined_steps = 0;
};

// Runs `reqs` all at once on a fresh engine (BenchEngineOptions) over
// `backend`, which is handed back afterwards (also on failure when the
// engine was made); one short warm-up request first, outside the timing.
// `label`: the progress line on a terminal.
Result<EngineRunResult> RunEngineOnce(std::unique_ptr<backend::Backend>& backend,
                                      const EngineBenchOptions& o,
                                      const std::vector<engine::EngineRequest>& reqs, int max_batch,
                                      bool prefix_caching, const std::string& label);

nlohmann::json ToJson(const EngineRunResult& r);

}  // namespace agentkv::cli
