// agentkv generate --model DIR (--prompt TEXT | --ids 1,2,3) [--chat] [sampling]
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_options.h"
#include "engine/offline_runner.h"

namespace agentkv::cli {
namespace {

struct GenerateArgs {
  ModelOptions model;
  SamplingOptions sampling;
  std::string prompt, ids;
  bool chat = false, json = false;
};

int RunGenerate(const GenerateArgs& a) {
  std::vector<int32_t> prompt;
  std::string err;
  if (!a.ids.empty()) {
    if (!ParseIds(a.ids, prompt, err)) {
      std::cerr << "error: " << err << "\n";
      return 2;
    }
  } else {
    std::cerr << "error: --prompt needs the tokenizer, which this build lacks; use --ids\n";
    return 2;
  }
  SamplingParams params = a.sampling.Get();
  if (Status s = params.Validate(); !s.ok()) {
    std::cerr << "error: " << s.ToString() << "\n";
    return 2;
  }
  auto backend = CreateBackend(a.model.model_dir, a.model.backend);
  if (!backend.ok()) {
    std::cerr << "error: " << backend.status().ToString() << "\n";
    return 1;
  }
  const ModelConfig& cfg = (*backend)->config();
  OfflineRunnerOptions ro;
  ro.max_batch = 1;
  ro.max_context = static_cast<int32_t>(prompt.size()) + params.max_tokens.value_or(128) + 1;
  if (cfg.max_position_embeddings > 0)
    ro.max_context = std::min(ro.max_context, cfg.max_position_embeddings);
  OfflineRunner runner(**backend, cfg.eos_token_ids, ro);
  auto res = runner.Run({GenRequest{prompt, params}});
  if (!res.ok()) {
    std::cerr << "error: " << res.status().ToString() << "\n";
    return 1;
  }
  const GenResult& r = (*res)[0];
  nlohmann::json j;
  j["ids"] = r.output;
  j["finish_reason"] = r.finish_reason;
  j["prompt_tokens"] = prompt.size();
  j["ttft_s"] = r.ttft_s;
  j["total_s"] = r.total_s;
  std::cout << j.dump() << "\n";
  return 0;
}

Registrar reg("generate", "Generate a continuation of a prompt", [](CLI::App& app) -> Runner {
  auto a = std::make_shared<GenerateArgs>();
  a->model.Add(app);
  a->sampling.Add(app);
  auto* p = app.add_option("--prompt", a->prompt, "Prompt text");
  auto* i = app.add_option("--ids", a->ids, "Prompt as comma-separated token ids");
  p->excludes(i);
  app.add_flag("--chat", a->chat, "Wrap the prompt as a user message in the chat template");
  app.add_flag("--json", a->json, "Print one JSON object: ids, text, finish_reason, timings");
  return [a] { return RunGenerate(*a); };
});

}  // namespace
}  // namespace agentkv::cli
