// Host cost of picking a constrained row, per row, through the code the
// engine runs (Sampler with a json_object grammar, as `response_format:
// {"type": "json_object"}`), for the Llama 3 (128,256) and Qwen3 (151,936)
// vocabularies with random logits:
//   Masked*:     the row masked on the host, then picked (Sampler::Sample:
//                the grammar's mask, the -inf pass, argmax or the draw) -
//                every constrained row before optimistic picks, and a
//                rejected one after;
//   FillMask:    the mask alone (GrammarMatcher::FillMask), part of Masked;
//   Optimistic:  the check of the backend's pick (Sampler::AcceptPick), what
//                an accepted row costs the host now;
//   ArgmaxCheck: argmax over the row plus the check (the CPU backend, whose
//                argmax runs on the host);
//   HostOptimisticSampled: the same procedure made on the host for a
//                temperature-1 row (Sampler::SampleOptimistic: a draw from
//                the unmasked row, then the check), accepted.
// Each step fills 64 rows (a c64 step) from a pool of random rows outside
// the timing (manual time), so the timed passes read rows not in cache, as
// rows copied from a GPU are; all 64 sequences follow one JSON document
// (its next token biased to the top of each row), so the grammar walks a
// realistic path and the mask cache holds what a schema shared by the
// batch's requests would.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema.h"
#include "engine/sampler.h"
#include "engine/text/tokenizer.h"

namespace {

using namespace agentkv;

constexpr int kRows = 64;
constexpr const char* kDocument =
    R"({"name": "agentkv", "version": 3, "features": ["structured outputs", "logprobs"], )"
    R"("limits": {"max_tokens": 32000, "temperature": 0.7, "stop": null}, "ok": true})";

struct Vocab {
  std::unique_ptr<text::Tokenizer> tok;
  std::shared_ptr<const grammar::Grammar> grammar;
  std::vector<int32_t> doc;
  int32_t vocab = 0;
  std::vector<float> pool;  // kRows + 7 random rows
};

Vocab& Get(int which) {
  static Vocab v[2];
  static bool init[2] = {false, false};
  Vocab& x = v[which];
  if (init[which]) return x;
  init[which] = true;
  const char* dir = which == 0 ? "llama3_1" : "qwen3";
  x.vocab = which == 0 ? 128256 : 151936;
  auto t = text::Tokenizer::Load(std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers" / dir /
                                 "tokenizer.json");
  if (!t.ok()) return x;
  x.tok = std::move(*t);
  auto g = grammar::CompileAnyJsonObject(grammar::TokenVocabulary::Build(*x.tok, x.vocab));
  if (!g.ok()) return x;
  x.grammar = *g;
  x.doc = x.tok->Encode(kDocument, false);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 2.f);
  x.pool.resize(static_cast<size_t>(kRows + 7) * static_cast<size_t>(x.vocab));
  for (float& f : x.pool) f = nd(rng);
  return x;
}

// The CPU backend's greedy pick (Backend::ForwardSampled's loop).
int32_t Argmax(std::span<const float> row) {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i] > best_v) {
      best_v = row[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

enum Mode {
  kMaskedGreedy,
  kMaskedSampled,
  kFillMask,
  kOptimistic,
  kArgmaxCheck,
  kHostOptimisticSampled
};

void Run(benchmark::State& state, Mode mode) {
  Vocab& v = Get(static_cast<int>(state.range(0)));
  if (!v.grammar) {
    state.SkipWithError("no tokenizer under data/tokenizers");
    return;
  }
  const size_t V = static_cast<size_t>(v.vocab);
  engine::SamplingParams p;
  p.temperature = mode == kMaskedSampled || mode == kHostOptimisticSampled ? 1.0f : 0.0f;
  p.seed = 1;
  p.grammar = v.grammar;
  std::vector<std::unique_ptr<engine::Sampler>> samplers;
  std::vector<grammar::GrammarMatcher> matchers;
  auto reset = [&] {
    samplers.clear();
    matchers.clear();
    for (int i = 0; i < kRows; ++i) {
      samplers.push_back(std::make_unique<engine::Sampler>(p, v.vocab));
      matchers.emplace_back(v.grammar);
    }
  };
  reset();
  std::vector<float> rows(kRows * V);
  std::vector<uint64_t> mask((V + 63) / 64);
  size_t pos = 0, step = 0;
  int64_t picked = 0;
  double timed = 0;
  for (auto _ : state) {
    if (pos == v.doc.size()) {
      pos = 0;
      reset();
    }
    const int32_t want = v.doc[pos];
    for (int r = 0; r < kRows; ++r) {
      float* row = rows.data() + r * V;
      std::memcpy(row, v.pool.data() + ((step + static_cast<size_t>(r)) % (kRows + 7)) * V,
                  V * sizeof(float));
      row[static_cast<size_t>(want)] = 100.f;  // the document's token: the model's favourite
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kRows; ++r) {
      const std::span<float> row(rows.data() + r * V, V);
      int32_t tok = want;
      switch (mode) {
        case kMaskedGreedy:
        case kMaskedSampled:
          tok = samplers[r]->Sample(row).token;
          break;
        case kFillMask:
          matchers[r].FillMask(mask);
          benchmark::DoNotOptimize(mask.data());
          break;
        case kOptimistic:
          if (!samplers[r]->AcceptPick(want)) tok = -1;
          break;
        case kHostOptimisticSampled:
          tok = samplers[r]->SampleOptimistic(row).token;
          break;
        case kArgmaxCheck:
          tok = Argmax(row);
          if (!samplers[r]->AcceptPick(tok)) tok = -1;
          break;
      }
      if (tok != want) {
        state.SkipWithError("the pick left the document");
        return;
      }
      ++picked;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (mode == kFillMask)
      for (auto& m : matchers)
        if (!m.Advance(want).ok()) state.SkipWithError("the document does not match");
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    timed += std::chrono::duration<double>(t1 - t0).count();
    ++pos;
    ++step;
  }
  // Microseconds of wall time per row (the time column: per 64 rows).
  state.counters["us_per_row"] = picked > 0 ? 1e6 * timed / static_cast<double>(picked) : 0.0;
  state.SetLabel(state.range(0) == 0 ? "llama3 128256" : "qwen3 151936");
}

void BM_MaskedGreedy(benchmark::State& s) { Run(s, kMaskedGreedy); }
void BM_MaskedSampled(benchmark::State& s) { Run(s, kMaskedSampled); }
void BM_FillMask(benchmark::State& s) { Run(s, kFillMask); }
void BM_Optimistic(benchmark::State& s) { Run(s, kOptimistic); }
void BM_ArgmaxCheck(benchmark::State& s) { Run(s, kArgmaxCheck); }
void BM_HostOptimisticSampled(benchmark::State& s) { Run(s, kHostOptimisticSampled); }

BENCHMARK(BM_MaskedGreedy)->Arg(0)->Arg(1)->UseManualTime();
BENCHMARK(BM_MaskedSampled)->Arg(0)->Arg(1)->UseManualTime();
BENCHMARK(BM_FillMask)->Arg(0)->Arg(1)->UseManualTime();
BENCHMARK(BM_Optimistic)->Arg(0)->Arg(1)->UseManualTime();
BENCHMARK(BM_ArgmaxCheck)->Arg(0)->Arg(1)->UseManualTime();
BENCHMARK(BM_HostOptimisticSampled)->Arg(0)->Arg(1)->UseManualTime();

}  // namespace
