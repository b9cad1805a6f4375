// agentkv bench engine --model DIR --concurrency 1,8 --prompt 128 --output 64 [--json]
//
// Engine-only throughput (no HTTP). At each concurrency level c, c requests
// of random prompt tokens run together with continuous batching (greedy, EOS
// ignored, so each produces exactly --output tokens); with --baseline the
// same requests also run one at a time. With --shared-prefix N, the requests
// share an N-token prefix (a system prompt) and the run is repeated with the
// prefix cache off, for time to first token.
//
// What each request asks beyond plain greedy decoding, so that its cost can
// be set against the plain run on the same device:
//   --logprobs N         the chosen token's logprob and the N most likely
//                        (OpenAI logprobs + top_logprobs = N; 0..20).
//   --response-format json_object
//                        constrained to JSON objects (the json_object mask
//                        of the model's tokenizer; --optimistic-grammar
//                        says how constrained rows are picked) one after
//                        another without end (CompileJsonObjectStream), so
//                        each request still writes --output tokens.
//   --temperature T      sampled rather than greedy (seeded per request).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/engine_bench.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/grammar/json_schema.h"
#include "engine/text/tokenizer.h"

namespace agentkv::cli {
namespace {

struct BenchArgs {
  ModelOptions model;
  EngineBenchOptions engine;
  std::string concurrency = "1,8";
  int requests = 0;
  int shared_prefix = 0;
  bool json = false, baseline = false;
  uint64_t seed = 1;
  int logprobs = -1;            // -1: none
  std::string response_format;  // "" or "json_object"
};

// The --response-format grammar on the model's tokenizer (null for none).
Result<std::shared_ptr<const grammar::Grammar>> BenchGrammar(const BenchArgs& a, int32_t vocab) {
  if (a.response_format.empty()) return std::shared_ptr<const grammar::Grammar>();
  if (a.response_format != "json_object")
    return InvalidArgument("--response-format: only json_object is supported");
  ASSIGN_OR_RETURN(
      std::unique_ptr<text::Tokenizer> tok,
      text::Tokenizer::Load(std::filesystem::path(a.model.model_dir) / "tokenizer.json"));
  return grammar::CompileJsonObjectStream(grammar::TokenVocabulary::Build(*tok, vocab));
}

int RunBench(const BenchArgs& a) {
  std::vector<int32_t> levels;
  std::string err;
  if (!ParseIds(a.concurrency, levels, err) ||
      std::any_of(levels.begin(), levels.end(), [](int32_t c) { return c <= 0; })) {
    std::cerr << "error: bad --concurrency '" << a.concurrency << "'\n";
    return 2;
  }
  if (a.logprobs < -1 || a.logprobs > engine::SamplingParams::kMaxLogprobs) {
    std::cerr << "error: --logprobs must be in [0, " << engine::SamplingParams::kMaxLogprobs
              << "]\n";
    return 2;
  }
  if (a.engine.prompt <= 0 || a.engine.output <= 0 || a.shared_prefix < 0 ||
      a.shared_prefix >= a.engine.prompt) {
    std::cerr << "error: need --prompt > --shared-prefix >= 0 and --output > 0\n";
    return 2;
  }
  auto created = backend::CreateBackend(a.model.model_dir, a.model.backend);
  if (!created.ok()) {
    std::cerr << "error: " << created.status().ToString() << "\n";
    return 1;
  }
  std::unique_ptr<backend::Backend> backend = std::move(created).value();
  const int32_t vocab = backend->config().vocab_size;
  auto grammar = BenchGrammar(a, vocab);
  if (!grammar.ok()) {
    std::cerr << "error: " << grammar.status().ToString() << "\n";
    return 1;
  }
  nlohmann::json out;
  out["model"] = a.model.model_dir;
  out["device"] = backend->name();
  out["kv_format"] = backend->kv_format();
  out["kv_bytes_per_token"] = backend->cache_spec().BytesPerTokenPerLayer() *
                              static_cast<size_t>(backend->cache_spec().num_layers);
  out["prompt_tokens"] = a.engine.prompt;
  out["output_tokens"] = a.engine.output;
  out["shared_prefix"] = a.shared_prefix;
  out["logprobs"] = a.logprobs >= 0 ? nlohmann::json(a.logprobs) : nlohmann::json(nullptr);
  out["response_format"] = a.response_format.empty() ? "text" : a.response_format;
  out["levels"] = nlohmann::json::array();
  std::mt19937_64 rng(a.seed);
  std::vector<int32_t> prefix(a.shared_prefix);
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % vocab);
  for (int32_t c : levels) {
    const int n = a.requests > 0 ? a.requests : c;
    std::vector<engine::EngineRequest> reqs = BenchRequests(rng, n, prefix, a.engine, vocab);
    for (engine::EngineRequest& r : reqs) {
      if (a.logprobs >= 0) r.params.logprobs = a.logprobs;
      if (*grammar) {
        r.params.grammar = *grammar;
        r.params.ignore_eos = false;  // (the stream never lets a request stop)
      }
    }
    nlohmann::json lv;
    lv["concurrency"] = c;
    lv["requests"] = n;
    const std::string label = "concurrency " + std::to_string(c);
    auto batched = RunEngineOnce(backend, a.engine, reqs, c, true, label);
    if (!batched.ok()) {
      std::cerr << "error: " << batched.status().ToString() << "\n";
      return 1;
    }
    lv.update(ToJson(*batched));
    std::string line = label + ": " + std::to_string(batched->output_tok_s) +
                       " output tok/s, mean TTFT " + std::to_string(batched->mean_ttft_ms) + " ms";
    if (batched->grammar_optimistic_rows > 0)
      line += " (grammar: " + std::to_string(batched->grammar_rejected_rows) + " of " +
              std::to_string(batched->grammar_optimistic_rows) + " optimistic picks rejected)";
    if (a.shared_prefix > 0) {
      auto nocache = RunEngineOnce(backend, a.engine, reqs, c, false, label + " (no prefix cache)");
      if (!nocache.ok()) {
        std::cerr << "error: " << nocache.status().ToString() << "\n";
        return 1;
      }
      lv["without_prefix_cache"] = ToJson(*nocache);
      line += "; without prefix cache: mean TTFT " + std::to_string(nocache->mean_ttft_ms) + " ms";
    }
    if (a.baseline && c > 1) {
      auto seq = RunEngineOnce(backend, a.engine, reqs, 1, true, label + " (one at a time)");
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
      a->engine.Add(app);
      app.add_option("--requests", a->requests, "Requests per level (0 = the concurrency)")
          ->capture_default_str();
      app.add_option("--shared-prefix", a->shared_prefix,
                     "Leading prompt tokens all requests share; also runs without "
                     "the prefix cache")
          ->capture_default_str();
      app.add_flag("--baseline", a->baseline, "Also run each level's requests one at a time");
      app.add_option("--seed", a->seed, "Seed of the random prompts")->capture_default_str();
      app.add_flag("--json", a->json, "Print one JSON object");
      app.add_option("--logprobs", a->logprobs,
                     "Every request asks for logprobs with this many top entries (0..20; "
                     "OpenAI top_logprobs); -1: none")
          ->capture_default_str();
      app.add_option("--response-format", a->response_format,
                     "json_object: every request constrained to JSON objects (one after "
                     "another, so each still writes --output tokens)");
      app.add_option("--temperature", a->engine.temperature,
                     "Temperature of every request (0 = greedy; > 0: plain sampling, seeded "
                     "per request)")
          ->check(CLI::Range(0.0f, 2.0f))
          ->capture_default_str();
      return [a] { return RunBench(*a); };
    });

}  // namespace
}  // namespace agentkv::cli
