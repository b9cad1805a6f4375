// Cost of one constrained-decoding step (GrammarMatcher::FillMask + Advance)
// for one sequence on one core, with the Qwen3 tokenizer (151k tokens) and
// typical agent schemas. Each benchmark replays the tokens of a valid
// document through the matcher and reports the mean per step:
//   *_Cold: a freshly compiled grammar each replay (empty mask cache: the
//           first request with a schema);
//   *_Warm: the same grammar replayed again (the cache holds the masks of
//           states that recur, as for later requests with the same schema).
// Also: building the token vocabulary (once per tokenizer) and compiling.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema.h"
#include "engine/text/tokenizer.h"

namespace {

using namespace agentkv;

struct Fixture {
  std::unique_ptr<text::Tokenizer> tok;
  std::shared_ptr<const grammar::TokenVocabulary> vocab;
};

Fixture& Get() {
  static Fixture f = [] {
    Fixture x;
    auto t = text::Tokenizer::Load(std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers" /
                                   "qwen3" / "tokenizer.json");
    if (!t.ok()) return x;
    x.tok = std::move(*t);
    x.vocab = grammar::TokenVocabulary::Build(*x.tok, x.tok->vocab_size());
    return x;
  }();
  return f;
}

struct Case {
  const char* schema;
  const char* document;
};

const Case kCases[] = {
    // A tool call's arguments: strings, an enum, an integer, an optional array.
    {R"({"type":"object","properties":{
        "path":{"type":"string"},
        "mode":{"enum":["read","write","append"]},
        "offset":{"type":"integer","minimum":0},
        "limit":{"type":"integer","minimum":1,"maximum":2000},
        "tags":{"type":"array","items":{"type":"string","maxLength":32},"maxItems":8}},
        "required":["path","mode"],"additionalProperties":false})",
     R"({"path": "/home/user/project/src/engine/grammar/json_schema.cc", "mode": "read", "offset": 120, "limit": 400, "tags": ["grammar", "review", "structured outputs"]})"},
    // A structured answer with nested objects, anyOf and prose in strings.
    {R"({"type":"object","properties":{
        "summary":{"type":"string"},
        "confidence":{"type":"number","minimum":0,"maximum":1},
        "findings":{"type":"array","items":{"type":"object","properties":{
            "file":{"type":"string"},"line":{"type":"integer","minimum":1},
            "severity":{"enum":["low","medium","high"]},
            "note":{"anyOf":[{"type":"string","maxLength":200},{"type":"null"}]}},
          "required":["file","line","severity","note"],"additionalProperties":false}}},
        "required":["summary","confidence","findings"],"additionalProperties":false})",
     R"({"summary": "The scheduler admits requests before checking the KV budget, so a burst of long prompts can evict resident agents that are about to resume.", "confidence": 0.8, "findings": [{"file": "src/engine/scheduler.cc", "line": 212, "severity": "high", "note": "Admission ignores the reserved blocks of waiting agents."}, {"file": "src/cache/block_pool.cc", "line": 88, "severity": "low", "note": null}]})"},
    // response_format {"type": "json_object"}: any object (nested values).
    {R"({"type":"object"})",
     R"({"name": "agentkv", "version": 3, "features": ["structured outputs", "logprobs"], "limits": {"max_tokens": 32000, "temperature": 0.7, "stop": null}, "ok": true})"},
};

std::shared_ptr<const grammar::Grammar> CompileCase(int i) {
  auto g = grammar::CompileJsonSchema(nlohmann::ordered_json::parse(kCases[i].schema), Get().vocab);
  return g.ok() ? *g : nullptr;
}

// Replays the document's tokens: a mask per step, then the token.
void Replay(benchmark::State& state, bool warm) {
  Fixture& f = Get();
  if (!f.tok) {
    state.SkipWithError("no data/tokenizers/qwen3");
    return;
  }
  const int i = static_cast<int>(state.range(0));
  const std::vector<int32_t> ids = f.tok->Encode(kCases[i].document, false);
  std::vector<uint64_t> mask((static_cast<size_t>(f.vocab->vocab_size()) + 63) / 64);
  std::shared_ptr<const grammar::Grammar> g = CompileCase(i);
  if (!g) {
    state.SkipWithError("the schema does not compile");
    return;
  }
  int64_t steps = 0, walked = 0;
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      g = CompileCase(i);
      state.ResumeTiming();
    }
    grammar::GrammarMatcher m(g);
    for (int32_t id : ids) {
      m.FillMask(mask);
      walked += m.last_walked();
      if (!((mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1)) {
        state.SkipWithError("the document's token is masked");
        return;
      }
      if (!m.Advance(id).ok()) {
        state.SkipWithError("the document does not match");
        return;
      }
      ++steps;
    }
    benchmark::DoNotOptimize(mask.data());
  }
  // Seconds of CPU per step (printed with an SI prefix: 21u = 21 us).
  state.counters["per_step"] = benchmark::Counter(
      static_cast<double>(steps), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["trie_nodes_per_step"] =
      static_cast<double>(walked) / static_cast<double>(std::max<int64_t>(steps, 1));
}

void BM_MaskStep_Cold(benchmark::State& state) { Replay(state, false); }
void BM_MaskStep_Warm(benchmark::State& state) { Replay(state, true); }
BENCHMARK(BM_MaskStep_Cold)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskStep_Warm)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

void BM_CompileSchema(benchmark::State& state) {
  if (!Get().tok) {
    state.SkipWithError("no data/tokenizers/qwen3");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(CompileCase(static_cast<int>(state.range(0))));
}
BENCHMARK(BM_CompileSchema)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_BuildVocabulary(benchmark::State& state) {
  Fixture& f = Get();
  if (!f.tok) {
    state.SkipWithError("no data/tokenizers/qwen3");
    return;
  }
  for (auto _ : state)
    benchmark::DoNotOptimize(grammar::TokenVocabulary::Build(*f.tok, f.tok->vocab_size()));
}
BENCHMARK(BM_BuildVocabulary)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
