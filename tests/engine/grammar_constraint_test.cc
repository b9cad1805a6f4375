#include "engine/grammar_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/sample_draw.h"
#include "engine/grammar/json_schema.h"
#include "engine/pick_mode.h"
#include "engine/sampler.h"

namespace agentkv::engine {
namespace {

// Tokens 0..n-2 spell text; the last id is EOS (no bytes).
const std::vector<std::string> kTokens = {
    "{",     "}",    "\"",     "a", "b", ":", ",",  " ", "true", "tr", "ue",
    "false", "null", "\"a\":", "1", "2", "x", "\\", "n", "e",    ""};
constexpr int32_t kEos = 20;

std::shared_ptr<const grammar::Grammar> Compile(const std::string& schema) {
  auto g = grammar::CompileJsonSchema(nlohmann::ordered_json::parse(schema),
                                      grammar::TokenVocabulary::FromTokens(kTokens));
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

std::string Generate(Sampler& s, uint32_t seed, int max_tokens, bool* stopped) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::string out;
  *stopped = false;
  for (int i = 0; i < max_tokens; ++i) {
    std::vector<float> logits(kTokens.size());
    for (float& l : logits) l = nd(rng);
    logits[kEos] = 10.f;  // the model would love to stop right away
    const int32_t t = s.Sample(logits).token;
    if (t == kEos) {
      *stopped = true;
      break;
    }
    out += kTokens[static_cast<size_t>(t)];
  }
  return out;
}

const char* kSchema = R"({"type":"object","properties":{"a":{"type":"boolean"}},
    "required":["a"],"additionalProperties":false})";

TEST(GrammarConstraintTest, GreedyAndSampledOutputsMatchAndStopOnlyWhenComplete) {
  auto g = Compile(kSchema);
  const std::vector<int32_t> eos = {kEos};
  for (float temperature : {0.0f, 1.0f}) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
      SamplingParams p;
      p.temperature = temperature;
      p.seed = seed;
      p.grammar = g;
      ASSERT_TRUE(p.Validate().ok());
      Sampler s(p, static_cast<int32_t>(kTokens.size()), eos);
      bool stopped;
      const std::string out = Generate(s, seed, 64, &stopped);
      ASSERT_TRUE(stopped) << out;
      auto j = nlohmann::json::parse(out, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << out;
      ASSERT_TRUE(j.is_object()) << out;
      EXPECT_EQ(j.size(), 1u);
      EXPECT_TRUE(j["a"].is_boolean()) << out;
    }
  }
}

TEST(GrammarConstraintTest, EndTokenOnlyWhenAcceptingAndAloneWhenComplete) {
  auto g = Compile(R"({"type":"integer"})");
  GrammarConstraint c(g, {kEos, 16});  // 16 ("x") also ends the sequence
  std::vector<float> logits(kTokens.size(), 0.f);
  c.Apply(logits);
  EXPECT_TRUE(std::isinf(logits[kEos]));  // nothing yet: no stop
  EXPECT_TRUE(std::isinf(logits[16]));
  EXPECT_FALSE(std::isinf(logits[14]));  // "1"
  EXPECT_TRUE(std::isinf(logits[0]));    // "{"
  c.Accept(14);
  std::fill(logits.begin(), logits.end(), 0.f);
  c.Apply(logits);
  EXPECT_FALSE(std::isinf(logits[kEos]));  // "1" is a whole integer
  EXPECT_FALSE(std::isinf(logits[16]));
  EXPECT_FALSE(std::isinf(logits[15]));  // "12" goes on
  // A complete match: only the end tokens.
  auto t = Compile(R"({"type":"boolean"})");
  GrammarConstraint b(t, {kEos});
  b.Accept(8);  // "true"
  std::fill(logits.begin(), logits.end(), 0.f);
  b.Apply(logits);
  for (size_t i = 0; i < kTokens.size(); ++i)
    EXPECT_EQ(std::isinf(logits[i]), i != static_cast<size_t>(kEos)) << i;
  // A token the grammar does not allow leaves the state alone.
  GrammarConstraint r(t, {kEos});
  r.Accept(0);
  EXPECT_FALSE(r.matcher().accepting());
  r.Accept(9);  // "tr"
  r.Accept(10);
  EXPECT_TRUE(r.matcher().accepting());
}

TEST(GrammarConstraintTest, ConstrainedRowsArePickedOnTheHost) {
  SamplingParams p;
  p.temperature = 0.7f;
  EXPECT_EQ(ChoosePickMode(p), backend::PickMode::kDevice);
  p.grammar = Compile(kSchema);
  EXPECT_EQ(ChoosePickMode(p), backend::PickMode::kHost);
  p.temperature = 0.f;
  EXPECT_EQ(ChoosePickMode(p), backend::PickMode::kHost);
  p.ignore_eos = true;
  EXPECT_FALSE(p.Validate().ok());
}

// Schemas over kTokens for the optimistic-pick tests: objects, nesting,
// enums, arrays, anyOf and any JSON object.
const char* const kOptimisticSchemas[] = {
    kSchema,
    R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},
        "b":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["a"]})",
    R"({"type":"object","properties":{"a":{"enum":["x","ab",true]},
        "b":{"type":"object","properties":{"a":{"type":"number"}}}},
        "required":["a","b"],"additionalProperties":false})",
    R"({"type":"object"})",
};

// A random row: normal logits, EOS often the favourite (as a model that
// wants to stop early), so both picks allowed and rejected are common.
std::vector<float> RandomRow(std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> l(kTokens.size());
  for (float& v : l) v = nd(rng);
  if (rng() % 3 == 0) l[kEos] = 12.f;
  return l;
}

// TryAccept says yes exactly for the tokens Apply leaves unmasked (an end
// token: where the output is a complete match), and a no changes nothing.
TEST(GrammarConstraintTest, TryAcceptAgreesWithTheMask) {
  for (const char* schema : kOptimisticSchemas) {
    auto g = Compile(schema);
    std::mt19937 rng(11);
    for (int walk = 0; walk < 10; ++walk) {
      GrammarConstraint c(g, {kEos});
      for (int step = 0; step < 40; ++step) {
        std::vector<float> row(kTokens.size(), 0.f);
        c.Apply(row);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < static_cast<int32_t>(kTokens.size()); ++t) {
          const bool ok = !std::isinf(row[static_cast<size_t>(t)]);
          GrammarConstraint probe = c;
          const grammar::GrammarState before = probe.matcher().state();
          const bool accepted = probe.TryAccept(t);
          if (t == kEos) {
            EXPECT_EQ(accepted, c.matcher().accepting()) << schema;
            EXPECT_TRUE(!accepted || ok);
          } else {
            EXPECT_EQ(accepted, ok) << schema << " token " << t << " step " << step;
          }
          if (!accepted) {
            EXPECT_EQ(probe.matcher().state().frames, before.frames) << t;
          }
          if (ok && t != kEos) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        ASSERT_TRUE(c.TryAccept(allowed[rng() % allowed.size()]));
      }
    }
  }
}

// AllowedArgmax is Argmax after Apply (lowest id on ties, NaN never wins),
// over rows with ties, NaN and -inf, on a vocabulary whose length is not a
// multiple of 64 words and one longer than a word.
TEST(GrammarConstraintTest, AllowedArgmaxIsTheArgmaxOfTheMaskedRow) {
  auto reference = [](const std::vector<float>& v) {
    int32_t best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] > best_v) {
        best_v = v[i];
        best = static_cast<int32_t>(i);
      }
    return best;
  };
  // kTokens repeated: 147 ids (three words, the last partial), EOS last.
  std::vector<std::string> tokens;
  for (int k = 0; k < 7; ++k) tokens.insert(tokens.end(), kTokens.begin(), kTokens.end() - 1);
  tokens.push_back("");
  const int32_t eos = static_cast<int32_t>(tokens.size()) - 1;
  auto g = grammar::CompileJsonSchema(nlohmann::ordered_json::parse(kOptimisticSchemas[1]),
                                      grammar::TokenVocabulary::FromTokens(tokens));
  ASSERT_TRUE(g.ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  int distinct = 0;
  for (int walk = 0; walk < 30; ++walk) {
    GrammarConstraint c(*g, {eos});
    for (int step = 0; step < 30; ++step) {
      std::vector<float> row(tokens.size());
      for (float& v : row) {
        v = std::round(nd(rng));  // ties are common
        const uint32_t r = rng() % 20;
        if (r == 0) v = std::numeric_limits<float>::quiet_NaN();
        if (r == 1) v = -std::numeric_limits<float>::infinity();
      }
      std::vector<float> masked = row;
      c.Apply(masked);
      const int32_t want = reference(masked);
      ASSERT_EQ(c.AllowedArgmax(row), want) << "walk " << walk << " step " << step;
      distinct += want != reference(row);
      if (want == eos || !c.TryAccept(want)) break;
    }
  }
  EXPECT_GT(distinct, 20);  // the mask changed the argmax often
}

// The engine's optimistic pick of a constrained row: the backend's pick
// from the unmasked row (argmax, or SampleDraw with the uniform drawn at
// launch) checked with AcceptPick; rejected: Sample() on the same row.
int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::distance(row.begin(), std::max_element(row.begin(), row.end())));
}

int32_t OptimisticPick(Sampler& s, const std::vector<float>& row) {
  std::vector<float> scratch = row;
  const int32_t backend_pick =
      s.params().greedy() ? Argmax(row) : backend::SampleDraw(scratch, s.NextDraw());
  if (s.AcceptPick(backend_pick)) return backend_pick;
  std::vector<float> kept = row;
  return s.Sample(kept).token;
}

std::vector<int32_t> GenerateTokens(Sampler& s, uint32_t seed, bool optimistic, int* rejected) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out;
  for (int i = 0; i < 48; ++i) {
    const std::vector<float> row = RandomRow(rng);
    int32_t t;
    if (optimistic) {
      t = OptimisticPick(s, row);
      if (s.params().greedy() && t != Argmax(row)) ++*rejected;
    } else {
      std::vector<float> masked = row;
      t = s.Sample(masked).token;
    }
    out.push_back(t);
    if (t == kEos) break;
  }
  return out;
}

// Greedy: the optimistic pick is the masked pick, token for token, over
// many random rows and grammars, rejections included.
TEST(GrammarConstraintTest, OptimisticGreedyPicksAreTheMaskedPicks) {
  int rejected = 0, tokens = 0;
  for (const char* schema : kOptimisticSchemas) {
    auto g = Compile(schema);
    for (uint32_t seed = 0; seed < 40; ++seed) {
      SamplingParams p;
      p.temperature = 0;
      p.grammar = g;
      ASSERT_TRUE(OptimisticGrammarPick(p));
      Sampler full(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
      Sampler opt(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
      int unused = 0;
      const std::vector<int32_t> want = GenerateTokens(full, seed, false, &unused);
      EXPECT_EQ(GenerateTokens(opt, seed, true, &rejected), want) << schema << " seed " << seed;
      tokens += static_cast<int>(want.size());
    }
  }
  // Both paths ran: most picks accepted, many rejected.
  EXPECT_GT(rejected, 50);
  EXPECT_LT(rejected, tokens);
}

// A rejected pick changes nothing (the grammar's state stays), and the
// masked pick follows; an end token is a pick only once the output is
// complete.
TEST(GrammarConstraintTest, RejectedPickLeavesTheSamplerAsItWas) {
  SamplingParams p;
  p.temperature = 0;
  p.grammar = Compile(kSchema);
  Sampler s(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
  std::vector<float> row(kTokens.size(), 0.f);
  row[kEos] = 10.f;  // EOS first: not allowed before the object is complete
  row[1] = 9.f;      // "}": not allowed either
  row[0] = 1.f;      // "{": the only start
  EXPECT_FALSE(s.AcceptPick(kEos));
  EXPECT_FALSE(s.AcceptPick(1));
  std::vector<float> kept = row;
  EXPECT_EQ(s.Sample(kept).token, 0);
  // "{" then "\"a\":" is the object's only key.
  EXPECT_FALSE(s.AcceptPick(0));  // a second "{" is no key
  EXPECT_TRUE(s.AcceptPick(13));
  EXPECT_TRUE(s.AcceptPick(8));  // true
  EXPECT_FALSE(s.AcceptPick(kEos));
  EXPECT_TRUE(s.AcceptPick(1));     // }
  EXPECT_TRUE(s.AcceptPick(kEos));  // complete: the end token is the pick
}

// Seeded temperature sampling: the optimistic picks repeat run after run,
// always follow the grammar, and are drawn from the masked distribution.
TEST(GrammarConstraintTest, OptimisticDrawsRepeatAndFollowTheMaskedDistribution) {
  for (const char* schema : kOptimisticSchemas) {
    auto g = Compile(schema);
    for (uint32_t seed = 0; seed < 20; ++seed) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.seed = seed;
      p.grammar = g;
      ASSERT_TRUE(OptimisticGrammarPick(p));
      Sampler a(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
      Sampler b(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
      int unused = 0;
      const std::vector<int32_t> out = GenerateTokens(a, seed, true, &unused);
      EXPECT_EQ(GenerateTokens(b, seed, true, &unused), out);
      // Every token allowed; an end only where the output is complete or
      // the small vocabulary can spell no continuation (the mask's
      // fallback).
      GrammarConstraint c(g, {kEos});
      for (int32_t t : out) {
        if (t == kEos) break;
        EXPECT_TRUE(c.TryAccept(t)) << schema;
      }
      if (!out.empty() && out.back() == kEos && !c.matcher().accepting()) {
        std::vector<float> row(kTokens.size(), 0.f);
        c.Apply(row);
        for (size_t t = 0; t < kTokens.size(); ++t) {
          EXPECT_EQ(std::isinf(row[t]), t != static_cast<size_t>(kEos)) << schema << " " << t;
        }
      }
    }
  }
  // The distribution at one state (inside the object, after "{"): the
  // frequencies of the optimistic picks against softmax restricted to the
  // allowed tokens, which leave out most of the mass (p(A) small: most
  // picks are rejected and drawn again).
  auto g = Compile(kOptimisticSchemas[1]);
  std::mt19937 rng(5);
  std::vector<float> row(kTokens.size());
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : row) v = nd(rng);
  row[0] = 3.f;  // "{": the favourite, never allowed after the first
  std::vector<float> masked = row;
  GrammarConstraint probe(g, {kEos});
  probe.Accept(0);
  probe.Apply(masked);
  double z = 0;
  for (float v : masked) z += std::isinf(v) ? 0.0 : std::exp(static_cast<double>(v));
  const int draws = 20000;
  std::vector<double> freq(kTokens.size());
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 77;
  p.grammar = g;
  for (int i = 0; i < draws; ++i) {
    Sampler s(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
    p.seed = *p.seed + 1;
    ASSERT_TRUE(s.AcceptPick(0));
    freq[static_cast<size_t>(OptimisticPick(s, row))] += 1.0 / draws;
  }
  for (size_t t = 0; t < kTokens.size(); ++t) {
    const double want = std::isinf(masked[t]) ? 0.0 : std::exp(static_cast<double>(masked[t])) / z;
    const double sd = std::sqrt(want * (1 - want) / draws);
    EXPECT_NEAR(freq[t], want, 5 * sd + 1e-9) << "token " << t;
  }
}

// The host's optimistic pick (a row the backend did not pick) is the
// backend's, seeded draws included; greedy, the masked pick.
TEST(GrammarConstraintTest, HostOptimisticPicksAreTheBackends) {
  for (const char* schema : kOptimisticSchemas) {
    auto g = Compile(schema);
    for (float temperature : {0.0f, 1.0f, 0.6f}) {
      for (uint32_t seed = 0; seed < 10; ++seed) {
        SamplingParams p;
        p.temperature = temperature;
        p.seed = seed;
        p.grammar = g;
        Sampler backend_side(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
        Sampler host_side(p, static_cast<int32_t>(kTokens.size()), std::vector<int32_t>{kEos});
        std::mt19937 rng(seed);
        for (int i = 0; i < 48; ++i) {
          const std::vector<float> row = RandomRow(rng);
          std::vector<float> scratch = row;
          const int32_t want = OptimisticPick(backend_side, row);
          ASSERT_EQ(host_side.SampleOptimistic(scratch).token, want)
              << schema << " t " << temperature << " seed " << seed << " step " << i;
          if (want == kEos) break;
        }
      }
    }
  }
}

// Which rows take the optimistic pick: greedy and temperature-only
// constrained rows; top_k / top_p / min_p, penalties and logprobs keep the
// exact (masked-first) path on the host.
TEST(GrammarConstraintTest, OnlyGreedyAndTemperatureRowsPickOptimistically) {
  SamplingParams p;
  p.grammar = Compile(kSchema);
  EXPECT_TRUE(OptimisticGrammarPick(p));
  backend::RowPick r = PlanRowPick(p, true, /*kept_logits=*/true);
  EXPECT_EQ(r.mode, backend::PickMode::kDevice);
  EXPECT_EQ(r.keep_logits, 1);
  EXPECT_EQ(r.logprobs, -1);
  p.temperature = 0;
  r = PlanRowPick(p, true, true);
  EXPECT_EQ(r.mode, backend::PickMode::kGreedy);
  EXPECT_EQ(r.keep_logits, 1);
  // A backend that keeps no logits: the host, as before.
  r = PlanRowPick(p, true, false);
  EXPECT_EQ(r.mode, backend::PickMode::kHost);
  EXPECT_EQ(r.keep_logits, 0);
  for (int which = 0; which < 6; ++which) {
    SamplingParams q;
    q.temperature = 0.8f;
    q.grammar = p.grammar;
    if (which == 0) q.top_p = 0.9f;
    if (which == 1) q.top_k = 40;
    if (which == 2) q.min_p = 0.05f;
    if (which == 3) q.frequency_penalty = 0.5f;
    if (which == 4) q.logprobs = 2;
    if (which == 5) q.repetition_penalty = 1.1f;
    EXPECT_FALSE(OptimisticGrammarPick(q)) << which;
    r = PlanRowPick(q, true, true);
    EXPECT_EQ(r.mode, backend::PickMode::kHost) << which;
    EXPECT_EQ(r.keep_logits, 0) << which;
  }
  // Without a grammar nothing changes.
  SamplingParams plain;
  EXPECT_FALSE(OptimisticGrammarPick(plain));
  r = PlanRowPick(plain, false, true);
  EXPECT_EQ(r.mode, backend::PickMode::kDevice);
  EXPECT_EQ(r.keep_logits, 0);
}

}  // namespace
}  // namespace agentkv::engine
