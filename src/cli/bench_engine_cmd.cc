// agentkv bench engine --model DIR --concurrency 1,8 --prompt 128 --output 64 [--json]
//
// Engine-only throughput (no HTTP). At each concurrency level c, c requests
// of random prompt tokens run together with continuous batching (greedy, EOS
// ignored, so each produces exactly --output tokens); with --baseline the
// same requests also run one at a time. With --shared-prefix N, the requests
// share an N-token prefix (a system prompt) and the run is repeated with the
// prefix cache off, for time to first token.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/model_options.h"
#include "engine/engine.h"

namespace agentkv::cli {
namespace {

struct BenchArgs {
  ModelOptions model;
  std::string concurrency = "1,8";
  int prompt = 128, output = 64, requests = 0, max_step_tokens = 0, block_size = 16;
  int shared_prefix = 0;
  bool json = false, baseline = false, no_pipeline = false;
  uint64_t seed = 1;
};

struct RunResult {
  double seconds = 0, mean_ttft_ms = 0, output_tok_s = 0, step_ms = 0, forward_ms = 0,
         device_ms = 0, capture_ms = 0;
  int64_t graphs_captured = 0, output_tokens = 0, steps = 0, max_batch = 0, cached_tokens = 0,
          step_tokens = 0;
};

// Runs `reqs` on a fresh engine over `backend` (returned afterwards).
Result<RunResult> RunOnce(std::unique_ptr<Backend>& backend, const BenchArgs& a,
                          const std::vector<EngineRequest>& reqs, int max_batch, bool prefix,
                          const std::string& label) {
  const ModelCacheSpec spec = backend->cache_spec();
  EngineOptions eo;
  eo.block_size = a.block_size;
  eo.scheduler.max_batch = max_batch;
  eo.scheduler.max_step_tokens = a.max_step_tokens;
  eo.pipeline = !a.no_pipeline;
  eo.prefix_caching = prefix;
  eo.max_context = a.prompt + a.output + 2;
  for (size_t g = 0; g < spec.groups.size(); ++g)
    eo.blocks_per_group.push_back(
        max_batch * (spec.BlocksFor(static_cast<int>(g), eo.max_context, a.block_size) + 1));
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(std::move(backend), nullptr, eo));
  // Warm-up outside the timing (scratch buffers, first-touch of KV memory).
  {
    EngineRequest w = reqs[0];
    w.params.max_tokens = 2;
    for (int i = 0; i < 3 && i < static_cast<int>(w.prompt.size()); ++i) w.prompt[i] ^= 1;
    ASSIGN_OR_RETURN(RequestHandle h, engine->Submit(w));
    while (h.stream->Pop().kind == RequestOutput::Kind::kDelta) {
    }
  }
  const EngineStats st0 = engine->Stats();
  const int64_t steps0 = st0.steps;
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RequestHandle> hs;
  for (const auto& r : reqs) {
    ASSIGN_OR_RETURN(RequestHandle h, engine->Submit(r));
    hs.push_back(h);
  }
  RunResult rr;
  double ttft = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    while (true) {
      RequestOutput ev = hs[i].stream->Pop();
      if (ev.kind == RequestOutput::Kind::kError) return ev.error;
      if (ev.kind == RequestOutput::Kind::kFinished) {
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
  const EngineStats st = engine->Stats();
  rr.steps = st.steps - steps0;
  rr.step_ms = rr.steps > 0 ? 1000 * (st.step_seconds - st0.step_seconds) / rr.steps : 0;
  rr.forward_ms = rr.steps > 0 ? 1000 * (st.forward_seconds - st0.forward_seconds) / rr.steps : 0;
  rr.device_ms = rr.steps > 0 ? 1000 * (st.device_seconds - st0.device_seconds) / rr.steps : 0;
  rr.max_batch = st.max_batch_size;
  rr.step_tokens = engine->max_step_tokens();
  rr.capture_ms = 1000 * (st.graph_capture_seconds - st0.graph_capture_seconds);
  rr.graphs_captured = st.graphs_captured - st0.graphs_captured;
  backend = engine->ReleaseBackend();
  return rr;
}

nlohmann::json ToJson(const RunResult& r) {
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
          {"graph_capture_ms", r.capture_ms}};
}

int RunBench(const BenchArgs& a) {
  std::vector<int32_t> levels;
  std::string err;
  if (!ParseIds(a.concurrency, levels, err) ||
      std::any_of(levels.begin(), levels.end(), [](int32_t c) { return c <= 0; })) {
    std::cerr << "error: bad --concurrency '" << a.concurrency << "'\n";
    return 2;
  }
  if (a.prompt <= 0 || a.output <= 0 || a.shared_prefix < 0 || a.shared_prefix >= a.prompt) {
    std::cerr << "error: need --prompt > --shared-prefix >= 0 and --output > 0\n";
    return 2;
  }
  auto created = CreateBackend(a.model.model_dir, a.model.backend);
  if (!created.ok()) {
    std::cerr << "error: " << created.status().ToString() << "\n";
    return 1;
  }
  std::unique_ptr<Backend> backend = std::move(created).value();
  const int32_t vocab = backend->config().vocab_size;
  nlohmann::json out;
  out["model"] = a.model.model_dir;
  out["device"] = backend->name();
  out["kv_format"] = backend->kv_format();
  out["kv_bytes_per_token"] = backend->cache_spec().BytesPerTokenPerLayer() *
                              static_cast<size_t>(backend->cache_spec().num_layers);
  out["prompt_tokens"] = a.prompt;
  out["output_tokens"] = a.output;
  out["shared_prefix"] = a.shared_prefix;
  out["levels"] = nlohmann::json::array();
  std::mt19937_64 rng(a.seed);
  std::vector<int32_t> prefix(a.shared_prefix);
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % vocab);
  for (int32_t c : levels) {
    const int n = a.requests > 0 ? a.requests : c;
    std::vector<EngineRequest> reqs(n);
    for (auto& r : reqs) {
      r.prompt = prefix;
      while (static_cast<int>(r.prompt.size()) < a.prompt)
        r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
      r.params.temperature = 0.0f;
      r.params.ignore_eos = true;
      r.params.max_tokens = a.output;
    }
    nlohmann::json lv;
    lv["concurrency"] = c;
    lv["requests"] = n;
    const std::string label = "concurrency " + std::to_string(c);
    auto batched = RunOnce(backend, a, reqs, c, true, label);
    if (!batched.ok()) {
      std::cerr << "error: " << batched.status().ToString() << "\n";
      return 1;
    }
    lv.update(ToJson(*batched));
    std::string line = label + ": " + std::to_string(batched->output_tok_s) +
                       " output tok/s, mean TTFT " + std::to_string(batched->mean_ttft_ms) + " ms";
    if (a.shared_prefix > 0) {
      auto nocache = RunOnce(backend, a, reqs, c, false, label + " (no prefix cache)");
      if (!nocache.ok()) {
        std::cerr << "error: " << nocache.status().ToString() << "\n";
        return 1;
      }
      lv["without_prefix_cache"] = ToJson(*nocache);
      line += "; without prefix cache: mean TTFT " + std::to_string(nocache->mean_ttft_ms) + " ms";
    }
    if (a.baseline && c > 1) {
      auto seq = RunOnce(backend, a, reqs, 1, true, label + " (one at a time)");
      if (!seq.ok()) {
        std::cerr << "error: " << seq.status().ToString() << "\n";
        return 1;
      }
      lv["one_at_a_time"] = ToJson(*seq);
      lv["speedup"] = batched->output_tok_s / seq->output_tok_s;
      line += "; one at a time: " + std::to_string(seq->output_tok_s) + " tok/s (x" +
              std::to_string(batched->output_tok_s / seq->output_tok_s) + ")";
    }
    out["levels"].push_back(lv);
    if (!a.json) std::cout << line << "\n";
  }
  if (a.json) std::cout << out.dump() << "\n";
  return 0;
}

Registrar reg(
    "bench engine", "Engine-only throughput at several concurrency levels",
    [](CLI::App& app) -> Runner {
      auto a = std::make_shared<BenchArgs>();
      a->model.Add(app);
      app.add_option("--concurrency", a->concurrency, "Comma-separated levels")
          ->capture_default_str();
      app.add_option("--prompt", a->prompt, "Prompt tokens per request")->capture_default_str();
      app.add_option("--output", a->output, "Output tokens per request")->capture_default_str();
      app.add_option("--requests", a->requests, "Requests per level (0 = the concurrency)")
          ->capture_default_str();
      app.add_option("--shared-prefix", a->shared_prefix,
                     "Leading prompt tokens all requests share; also runs without "
                     "the prefix cache")
          ->capture_default_str();
      app.add_flag("--baseline", a->baseline, "Also run each level's requests one at a time");
      app.add_flag("--no-pipeline", a->no_pipeline,
                   "Collect every step before planning the next (EngineOptions::pipeline off)");
      app.add_option("--max-step-tokens", a->max_step_tokens,
                     "Token budget of one engine step (0 = the device's default)")
          ->capture_default_str();
      app.add_option("--block-size", a->block_size)->capture_default_str();
      app.add_option("--seed", a->seed, "Seed of the random prompts")->capture_default_str();
      app.add_flag("--json", a->json, "Print one JSON object");
      return [a] { return RunBench(*a); };
    });

}  // namespace
}  // namespace agentkv::cli
