#include "cli/engine_bench.h"

#include <unistd.h>

#include <chrono>
#include <iostream>

namespace agentkv::cli {

void EngineBenchOptions::Add(CLI::App& app) {
  app.add_option("--prompt", prompt, "Prompt tokens per request")->capture_default_str();
  app.add_option("--output", output, "Output tokens per request")->capture_default_str();
  app.add_flag("--no-pipeline", no_pipeline,
               "Collect every step before planning the next (EngineOptions::pipeline off)");
  app.add_option("--optimistic-grammar", optimistic_grammar,
                 "Optimistic picks of constrained rows (EngineOptions::optimistic_grammar): auto "
                 "(on a GPU), on (the CPU backend too) or off (every constrained row masked on "
                 "the host first)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--max-step-tokens", max_step_tokens,
                 "Token budget of one engine step (0 = the device's default)")
      ->capture_default_str();
  app.add_option("--block-size", block_size)->capture_default_str();
  app.add_flag("--speculative", speculative,
               "Speculative decoding from the context (EngineOptions::speculative ngram; the "
               "random prompts rarely repeat, so this measures its overhead)");
}

engine::EngineOptions BenchEngineOptions(const cache::ModelCacheSpec& spec,
                                         const EngineBenchOptions& o, int max_batch,
                                         bool prefix_caching) {
  engine::EngineOptions eo;
  eo.block_size = o.block_size;
  eo.scheduler.max_batch = max_batch;
  eo.scheduler.max_step_tokens = o.max_step_tokens;
  eo.pipeline = !o.no_pipeline;
  eo.optimistic_grammar = o.optimistic_grammar == "on"    ? engine::OptimisticGrammar::kOn
                          : o.optimistic_grammar == "off" ? engine::OptimisticGrammar::kOff
                                                          : engine::OptimisticGrammar::kAuto;
  if (o.speculative) eo.speculative.mode = engine::SpeculativeMode::kNgram;
  eo.prefix_caching = prefix_caching;
  eo.max_context = o.prompt + o.output + 2;
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    eo.blocks_per_group.push_back(
        max_batch * (spec.BlocksFor(static_cast<int>(g), eo.max_context, o.block_size) + 1));
  }
  return eo;
}

std::vector<engine::EngineRequest> BenchRequests(std::mt19937_64& rng, int n,
                                                 const std::vector<int32_t>& shared_prefix,
                                                 const EngineBenchOptions& o, int32_t vocab) {
  std::vector<engine::EngineRequest> reqs(n);
  uint64_t index = 0;
  for (auto& r : reqs) {
    r.prompt = shared_prefix;
    while (static_cast<int>(r.prompt.size()) < o.prompt)
      r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    r.params.temperature = o.temperature;
    if (o.temperature > 0) r.params.seed = index;
    ++index;
    r.params.ignore_eos = true;
    r.params.max_tokens = o.output;
  }
  return reqs;
}

Result<EngineRunResult> RunEngineOnce(std::unique_ptr<backend::Backend>& backend,
                                      const EngineBenchOptions& o,
                                      const std::vector<engine::EngineRequest>& reqs, int max_batch,
                                      bool prefix_caching, const std::string& label) {
  const engine::EngineOptions eo =
      BenchEngineOptions(backend->cache_spec(), o, max_batch, prefix_caching);
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                   engine::Engine::Create(std::move(backend), nullptr, eo));
  // The backend goes back to the caller however this run ends.
  struct GiveBack {
    std::unique_ptr<engine::Engine>& engine;
    std::unique_ptr<backend::Backend>& backend;
    ~GiveBack() { backend = engine->ReleaseBackend(); }
  } give_back{engine, backend};
  // Warm-up outside the timing (scratch buffers, first-touch of KV memory).
  {
    engine::EngineRequest w = reqs[0];
    w.params.max_tokens = 2;
    for (int i = 0; i < 3 && i < static_cast<int>(w.prompt.size()); ++i) w.prompt[i] ^= 1;
    ASSIGN_OR_RETURN(engine::RequestHandle h, engine->Submit(w));
    while (h.stream->Pop().kind == engine::RequestOutput::Kind::kDelta) {
    }
  }
  const engine::EngineStats st0 = engine->Stats();
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<engine::RequestHandle> hs;
  for (const auto& r : reqs) {
    ASSIGN_OR_RETURN(engine::RequestHandle h, engine->Submit(r));
    hs.push_back(h);
  }
  EngineRunResult rr;
  double ttft = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    while (true) {
      engine::RequestOutput ev = hs[i].stream->Pop();
      if (ev.kind == engine::RequestOutput::Kind::kError) return ev.error;
      if (ev.kind == engine::RequestOutput::Kind::kFinished) {
        rr.output_tokens += ev.completion_tokens;
        rr.cached_tokens += ev.cached_tokens;
        ttft += ev.ttft_s;
        break;
      }
    }
    if (tty)
      std::cerr << "\r" << label << ": " << i + 1 << "/" << hs.size() << " requests" << std::flush;
  }
  rr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tty) std::cerr << "\r\033[K";
  rr.mean_ttft_ms = 1000.0 * ttft / reqs.size();
  rr.output_tok_s = rr.output_tokens / rr.seconds;
  const engine::EngineStats st = engine->Stats();
  rr.steps = st.steps - st0.steps;
  rr.step_ms = rr.steps > 0 ? 1000 * (st.step_seconds - st0.step_seconds) / rr.steps : 0;
  rr.forward_ms = rr.steps > 0 ? 1000 * (st.forward_seconds - st0.forward_seconds) / rr.steps : 0;
  rr.device_ms = rr.steps > 0 ? 1000 * (st.device_seconds - st0.device_seconds) / rr.steps : 0;
  rr.max_batch = st.max_batch_size;
  rr.step_tokens = engine->max_step_tokens();
  rr.capture_ms = 1000 * (st.graph_capture_seconds - st0.graph_capture_seconds);
  rr.graphs_captured = st.graphs_captured - st0.graphs_captured;
  rr.graph_steps = st.graph_steps - st0.graph_steps;
  rr.draft_tokens = st.draft_tokens - st0.draft_tokens;
  rr.draft_accepted_tokens = st.draft_accepted_tokens - st0.draft_accepted_tokens;
  rr.grammar_optimistic_rows = st.grammar_optimistic_rows - st0.grammar_optimistic_rows;
  rr.grammar_rejected_rows = st.grammar_rejected_rows - st0.grammar_rejected_rows;
  rr.grammar_rolled_back_rows = st.grammar_rolled_back_rows - st0.grammar_rolled_back_rows;
  rr.pipelined_steps = st.pipelined_steps - st0.pipelined_steps;
  return rr;
}

nlohmann::json ToJson(const EngineRunResult& r) {
  return {{"seconds", r.seconds},
          {"output_tokens", r.output_tokens},
          {"output_tok_s", r.output_tok_s},
          {"mean_ttft_ms", r.mean_ttft_ms},
          {"steps", r.steps},
          {"max_batch", r.max_batch},
          {"max_step_tokens", r.step_tokens},
          {"cached_tokens", r.cached_tokens},
          {"mean_step_ms", r.step_ms},
          {"mean_forward_ms", r.forward_ms},
          {"mean_device_ms", r.device_ms},
          {"graphs_captured", r.graphs_captured},
          {"graph_capture_ms", r.capture_ms},
          {"graph_steps", r.graph_steps},
          {"draft_tokens", r.draft_tokens},
          {"draft_accepted_tokens", r.draft_accepted_tokens},
          {"grammar_optimistic_rows", r.grammar_optimistic_rows},
          {"grammar_rejected_rows", r.grammar_rejected_rows},
          {"grammar_rolled_back_rows", r.grammar_rolled_back_rows},
          {"pipelined_steps", r.pipelined_steps}};
}

}  // namespace agentkv::cli
