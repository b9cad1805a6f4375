// agentkv generate --model DIR (--prompt TEXT | --ids 1,2,3) [--chat] [sampling]
//
// Streams the generated text to stdout as it comes (or, with --json, prints
// one object with the ids, text, finish reason and timings at the end).
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/finish_reason.h"
#include "engine/text/chat/chat_template.h"
#include "engine/text/tokenizer.h"

namespace agentkv::cli {
namespace {

struct GenerateArgs {
  ModelOptions model;
  SamplingOptions sampling;
  std::string prompt, ids, system;
  bool chat = false, json = false;
  bool speculative = false;  // EngineOptions::speculative ngram
};

int Fail(const Status& s, int code = 1) {
  std::cerr << "error: " << s.ToString() << "\n";
  return code;
}

int RunGenerate(const GenerateArgs& a) {
  engine::SamplingParams params = a.sampling.Get();
  if (Status s = params.Validate(); !s.ok()) return Fail(s, 2);
  std::unique_ptr<text::Tokenizer> tokenizer;
  const std::filesystem::path tok_path =
      std::filesystem::path(a.model.model_dir) / "tokenizer.json";
  if (std::filesystem::exists(tok_path)) {
    auto t = text::Tokenizer::Load(tok_path);
    if (!t.ok()) return Fail(t.status());
    tokenizer = std::move(t).value();
  }
  std::vector<int32_t> prompt;
  if (!a.ids.empty()) {
    std::string err;
    if (!ParseIds(a.ids, prompt, err)) return Fail(InvalidArgument(err), 2);
  } else {
    if (!tokenizer) return Fail(NotFound(tok_path.string() + " is missing; use --ids"), 2);
    std::string text = a.prompt;
    bool add_special = true;
    if (a.chat) {
      auto tmpl = text::chat::ChatTemplate::LoadFromModelDir(a.model.model_dir);
      if (!tmpl.ok()) return Fail(tmpl.status());
      text::chat::ChatTemplate::Input in;
      if (!a.system.empty()) in.messages.push_back({{"role", "system"}, {"content", a.system}});
      in.messages.push_back({{"role", "user"}, {"content", a.prompt}});
      auto rendered = tmpl->Render(in);
      if (!rendered.ok()) return Fail(rendered.status());
      text = *rendered;
      add_special = false;  // the template writes its own special tokens
    }
    prompt = tokenizer->Encode(text, add_special);
  }
  auto backend = backend::CreateBackend(a.model.model_dir, a.model.backend);
  if (!backend.ok()) return Fail(backend.status());
  engine::EngineOptions eo;
  eo.scheduler.max_batch = 1;
  if (a.speculative) eo.speculative.mode = engine::SpeculativeMode::kNgram;
  eo.max_context = static_cast<int32_t>(prompt.size()) + params.max_tokens.value_or(128) + 1;
  const model::ModelConfig cfg = (*backend)->config();
  if (cfg.max_position_embeddings > 0)
    eo.max_context = std::min(eo.max_context, cfg.max_position_embeddings);
  const cache::ModelCacheSpec spec = (*backend)->cache_spec();
  for (size_t g = 0; g < spec.groups.size(); ++g)
    eo.blocks_per_group.push_back(spec.BlocksFor(static_cast<int>(g), eo.max_context, 16) + 1);
  auto engine = engine::Engine::Create(std::move(backend).value(), tokenizer.get(), eo);
  if (!engine.ok()) return Fail(engine.status());
  engine::EngineRequest req;
  req.prompt = prompt;
  req.params = params;
  auto h = (*engine)->Submit(req);
  if (!h.ok()) return Fail(h.status(), 2);
  std::vector<int32_t> out_ids;
  std::string text;
  while (true) {
    engine::RequestOutput ev = h->stream->Pop();
    if (ev.kind == engine::RequestOutput::Kind::kError) return Fail(ev.error);
    out_ids.insert(out_ids.end(), ev.tokens.begin(), ev.tokens.end());
    text += ev.text;
    if (!a.json) std::cout << ev.text << std::flush;
    if (ev.kind == engine::RequestOutput::Kind::kFinished) {
      if (a.json) {
        nlohmann::json j;
        j["ids"] = out_ids;
        j["text"] = text;
        j["finish_reason"] = engine::FinishReasonName(ev.finish);
        j["prompt_tokens"] = ev.prompt_tokens;
        j["completion_tokens"] = ev.completion_tokens;
        j["ttft_s"] = ev.ttft_s;
        // (Stats are published before the events they follow are pushed.)
        const engine::EngineStats st = (*engine)->Stats();
        j["draft_tokens"] = st.draft_tokens;
        j["draft_accepted_tokens"] = st.draft_accepted_tokens;
        std::cout << j.dump() << "\n";
      } else {
        std::cout << "\n";
      }
      return 0;
    }
  }
}

Registrar reg("generate", "Generate a continuation of a prompt", [](CLI::App& app) -> Runner {
  auto a = std::make_shared<GenerateArgs>();
  a->model.Add(app);
  a->sampling.Add(app);
  auto* p = app.add_option("--prompt", a->prompt, "Prompt text");
  auto* i = app.add_option("--ids", a->ids, "Prompt as comma-separated token ids");
  p->excludes(i);
  app.add_flag("--chat", a->chat, "Wrap the prompt as a user message in the model's chat template");
  app.add_option("--system", a->system, "System message (with --chat)");
  app.add_flag("--json", a->json,
               "Print one JSON object: ids, text, finish_reason, timings, draft tokens");
  app.add_flag("--speculative", a->speculative,
               "Speculative decoding from the context: n-gram drafts looked up in the prompt and "
               "output, verified in one step (the same greedy output)");
  return [a] {
    if (a->prompt.empty() && a->ids.empty()) {
      std::cerr << "error: give --prompt or --ids\n";
      return 2;
    }
    return RunGenerate(*a);
  };
});

}  // namespace
}  // namespace agentkv::cli
