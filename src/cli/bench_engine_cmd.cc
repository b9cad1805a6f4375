// agentkv bench engine --model DIR --concurrency 1,8 --prompt 128 --output 64 [--json]
//
// Output tokens per second of the engine alone (no HTTP), at each concurrency
// level: `concurrency` requests of random prompt tokens run together with
// continuous batching, greedy, EOS ignored so every request produces exactly
// --output tokens.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/model_options.h"
#include "engine/offline_runner.h"

namespace agentkv::cli {
namespace {

struct BenchArgs {
  ModelOptions model;
  std::string concurrency = "1,8";
  int prompt = 128, output = 64, requests = 0, max_step_tokens = 2048, block_size = 16;
  bool json = false;
  uint64_t seed = 1;
};

int RunBench(const BenchArgs& a) {
  std::vector<int32_t> levels;
  std::string err;
  if (!ParseIds(a.concurrency, levels, err) ||
      std::any_of(levels.begin(), levels.end(), [](int32_t c) { return c <= 0; })) {
    std::cerr << "error: bad --concurrency '" << a.concurrency << "'\n";
    return 2;
  }
  if (a.prompt <= 0 || a.output <= 0) {
    std::cerr << "error: --prompt and --output must be positive\n";
    return 2;
  }
  auto backend = CreateBackend(a.model.model_dir, a.model.backend);
  if (!backend.ok()) {
    std::cerr << "error: " << backend.status().ToString() << "\n";
    return 1;
  }
  const ModelConfig& cfg = (*backend)->config();
  const bool tty = isatty(STDERR_FILENO);
  nlohmann::json out;
  out["model"] = a.model.model_dir;
  out["device"] = (*backend)->name();
  out["prompt_tokens"] = a.prompt;
  out["output_tokens"] = a.output;
  out["levels"] = nlohmann::json::array();
  std::mt19937_64 rng(a.seed);
  for (int32_t c : levels) {
    const int n = a.requests > 0 ? a.requests : c;
    std::vector<GenRequest> reqs(n);
    for (auto& r : reqs) {
      r.prompt.resize(a.prompt);
      for (auto& t : r.prompt) t = static_cast<int32_t>(rng() % cfg.vocab_size);
      r.params.temperature = 0.0f;
      r.params.ignore_eos = true;
      r.params.max_tokens = a.output;
    }
    OfflineRunnerOptions ro;
    ro.max_batch = c;
    ro.max_step_tokens = a.max_step_tokens;
    ro.block_size = a.block_size;
    ro.max_context = a.prompt + a.output + 1;
    OfflineRunner runner(**backend, {}, ro);
    // Warm-up: one short request allocates KV and scratch outside the timing.
    GenRequest warm = reqs[0];
    warm.params.max_tokens = 2;
    if (auto w = runner.Run({warm}); !w.ok()) {
      std::cerr << "error: " << w.status().ToString() << "\n";
      return 1;
    }
    int64_t done = 0;
    const int64_t total = static_cast<int64_t>(n) * a.output;
    const auto t0 = std::chrono::steady_clock::now();
    auto res = runner.Run(reqs, [&](size_t, int32_t) {
      if (tty && ++done % 64 == 0)
        std::cerr << "\rconcurrency " << c << ": " << done << "/" << total << " tokens"
                  << std::flush;
    });
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tty) std::cerr << "\r\033[K";
    if (!res.ok()) {
      std::cerr << "error: " << res.status().ToString() << "\n";
      return 1;
    }
    int64_t produced = 0;
    double ttft = 0;
    for (const auto& r : *res) {
      produced += r.output.size();
      ttft += r.ttft_s;
    }
    nlohmann::json lv;
    lv["concurrency"] = c;
    lv["requests"] = n;
    lv["output_tokens"] = produced;
    lv["seconds"] = secs;
    lv["output_tok_s"] = produced / secs;
    lv["mean_ttft_ms"] = 1000.0 * ttft / n;
    lv["steps"] = runner.steps();
    out["levels"].push_back(lv);
    if (!a.json)
      std::cout << "concurrency " << c << ": " << produced / secs << " output tok/s, mean TTFT "
                << 1000.0 * ttft / n << " ms (" << produced << " tokens in " << secs << " s)\n";
  }
  if (a.json) std::cout << out.dump() << "\n";
  return 0;
}

Registrar reg("bench engine", "Engine-only throughput at several concurrency levels",
              [](CLI::App& app) -> Runner {
                auto a = std::make_shared<BenchArgs>();
                a->model.Add(app);
                app.add_option("--concurrency", a->concurrency, "Comma-separated levels")
                    ->capture_default_str();
                app.add_option("--prompt", a->prompt, "Prompt tokens per request")
                    ->capture_default_str();
                app.add_option("--output", a->output, "Output tokens per request")
                    ->capture_default_str();
                app.add_option("--requests", a->requests,
                               "Requests per level (0 = the concurrency)")
                    ->capture_default_str();
                app.add_option("--max-step-tokens", a->max_step_tokens,
                               "Token budget of one engine step")
                    ->capture_default_str();
                app.add_option("--block-size", a->block_size)->capture_default_str();
                app.add_option("--seed", a->seed, "Seed of the random prompts")
                    ->capture_default_str();
                app.add_flag("--json", a->json, "Print one JSON object");
                return [a] { return RunBench(*a); };
              });

}  // namespace
}  // namespace agentkv::cli
