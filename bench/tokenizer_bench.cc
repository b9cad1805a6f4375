// Encode throughput (bytes of input per second, one thread) of each
// tokenizer on a few MB of mixed English prose and source code, with a warm
// word cache (the steady state of a server) and decode throughput.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "engine/text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::string MixedText(size_t bytes) {
  static const char* kWords[] = {
      "the",     "of",         "and",        "to",        "in",         "is",
      "that",    "for",        "it",         "with",      "as",         "was",
      "on",      "server",     "cache",      "request",   "tokenizer",  "batch",
      "agent",   "session",    "memory",     "latency",   "throughput", "model",
      "weights", "persistent", "continuous", "scheduler", "However,",   "because",
      "which",   "would",      "their",      "there",     "about",      "configuration",
      "don't",   "it's",       "we'll",      "2024",      "3.14",       "100%",
      "(see",    "below)",     "e.g.",       "i.e.,"};
  static const char* kCode[] = {
      "for (int i = 0; i < n; ++i) {\n    sum += values[i] * weights[i];\n}\n",
      "def forward(self, x):\n        h = self.norm(x)\n        return self.proj(h) + x\n",
      "if (status.ok() && !queue.empty()) { return queue.front(); }\n",
      "const result = await fetch(`/v1/agents/${id}/generate`, { method: 'POST' });\n",
      "    # TODO: handle the error path\n    raise ValueError(f\"bad value: {value!r}\")\n",
      "#include <vector>\n#include \"util/status.h\"\n\nnamespace agentkv {\n",
  };
  std::mt19937 rng(42);
  std::string s;
  s.reserve(bytes + 256);
  while (s.size() < bytes) {
    if (rng() % 4 == 0) {
      s += kCode[rng() % std::size(kCode)];
    } else {
      for (int i = 0, n = 8 + static_cast<int>(rng() % 20); i < n; ++i) {
        s += kWords[rng() % std::size(kWords)];
        s += (rng() % 12 == 0) ? ".\n" : " ";
      }
      s += "\n\n";
    }
  }
  return s;
}

const std::string& Text() {
  static const std::string text = MixedText(4 << 20);
  return text;
}

const agentkv::text::Tokenizer* Get(const std::string& name) {
  static std::map<std::string, std::unique_ptr<agentkv::text::Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  auto t = agentkv::text::Tokenizer::Load(fs::path(AGENTKV_DATA_DIR) / "tokenizers" / name /
                                          "tokenizer.json");
  auto* ptr = t.ok() ? t.value().get() : nullptr;
  cache[name] = t.ok() ? std::move(t).value() : nullptr;
  return ptr;
}

void BM_Encode(benchmark::State& state, const std::string& name) {
  const auto* t = Get(name);
  if (!t) {
    state.SkipWithError("tokenizer missing: run scripts/setup.sh");
    return;
  }
  const std::string& text = Text();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = t->Encode(text, true);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes/token"] = static_cast<double>(text.size()) / static_cast<double>(tokens);
}

void BM_Decode(benchmark::State& state, const std::string& name) {
  const auto* t = Get(name);
  if (!t) {
    state.SkipWithError("tokenizer missing: run scripts/setup.sh");
    return;
  }
  auto ids = t->Encode(Text(), false);
  for (auto _ : state) {
    auto s = t->Decode(ids, false);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * Text().size()));
}

BENCHMARK_CAPTURE(BM_Encode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama3_1, std::string("llama3_1"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, gemma3, std::string("gemma3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, deepseek_v3, std::string("deepseek_v3"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, gemma3, std::string("gemma3"))->Unit(benchmark::kMillisecond);

}  // namespace
