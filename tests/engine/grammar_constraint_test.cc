#include "engine/grammar_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace agentkv::engine
