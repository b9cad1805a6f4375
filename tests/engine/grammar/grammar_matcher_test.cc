#include "engine/grammar/grammar_matcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"

namespace agentkv::grammar {
namespace {

// A small vocabulary with the shapes that matter: structure, partial and
// whole keys, multi-byte and split UTF-8, escapes, whitespace, digits.
// Every byte used also stands alone, as in byte-level BPE (a vocabulary
// without them could reach a prefix no token continues).
std::vector<std::string> SmallTokens() {
  std::vector<std::string> t = {
      "{",    "}",     "[",           "]",        ",",        ":",     "\"",   "\":",  "\",",
      "\"}",  " ",     "\n  ",        "a",        "ab",       "abc",   "b",    "name", "\"name",
      "\"na", "me\":", "tags",        "0",        "1",        "12",    "-",    ".",    "5",
      "e",    "true",  "tr",          "ue",       "null",     "nu",    "\\",   "\\n",  "\\u00",
      "e9",   "\xC3",  "\xA9",        "\xC3\xA9", "\xE2\x82", "\xAC",  "x\"",  "}]",   "\":\"",
      "\"]",  "kind",  "\"kind\":\"", "red",      "blue",     "green", "\"r",  "1.",   "-0",
      "00",   "",      "\x01",        "\xFF",     "\"\"",     "[\"",   "\",\""};
  std::set<std::string> have(t.begin(), t.end());
  const size_t n = t.size();
  for (size_t i = 0; i < n; ++i)
    for (char c : t[i])
      if (have.insert(std::string(1, c)).second) t.push_back(std::string(1, c));
  return t;
}

// Whether `s` can still be completed to a match (bounded search over the
// vocabulary's bytes): the independent meaning of "viable".
bool Completable(const Grammar& g, const GrammarState& s, const std::set<uint8_t>& alphabet) {
  if (s.accepting) return true;
  std::set<std::vector<int32_t>> seen;
  std::deque<GrammarState> q{s};
  GrammarState next;
  while (!q.empty() && seen.size() < 20000) {
    GrammarState cur = q.front();
    q.pop_front();
    for (uint8_t b : alphabet) {
      GrammarStep(g, cur, b, &next);
      if (next.accepting) return true;
      if (next.empty() || !seen.insert(next.frames).second) continue;
      q.push_back(next);
    }
  }
  return false;
}

void BruteForceWalk(const std::string& schema, uint32_t seed) {
  const auto tokens = SmallTokens();
  auto vocab = TokenVocabulary::FromTokens(tokens);
  std::set<uint8_t> alphabet;
  for (const auto& t : tokens)
    for (char c : t) alphabet.insert(static_cast<uint8_t>(c));
  auto g = CompileJsonSchema(nlohmann::ordered_json::parse(schema), vocab);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  GrammarMatcher m(*g);
  std::mt19937 rng(seed);
  std::vector<uint64_t> mask((tokens.size() + 63) / 64);
  std::string out;
  for (int step = 0; step < 40 && !m.complete(); ++step) {
    // The same state twice: the second mask may come from the cache.
    for (int pass = 0; pass < 2; ++pass) {
      m.FillMask(mask);
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < tokens.size(); ++t) {
        const bool bit = (mask[t / 64] >> (t % 64)) & 1;
        GrammarMatcher copy = m;
        // Allowed exactly when the token's bytes read and a match stays reachable.
        const bool brute = !tokens[t].empty() && copy.AdvanceBytes(tokens[t]).ok() &&
                           Completable(**g, copy.state(), alphabet);
        EXPECT_EQ(bit, brute) << schema << " step " << step << " token '" << tokens[t] << "'";
        if (bit) allowed.push_back(static_cast<int32_t>(t));
      }
      if (pass == 1 && allowed.empty()) {
        EXPECT_TRUE(m.accepting()) << "a dead end at step " << step << " after "
                                   << nlohmann::json(out).dump() << " in " << schema;
        return;
      }
      if (pass == 1) {
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.Advance(pick).ok());
        out += tokens[static_cast<size_t>(pick)];
      }
    }
  }
}

TEST(GrammarMatcherTest, MaskEqualsBruteForce) {
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},
          "tags":{"type":"array","items":{"enum":["red","blue","green"]},"maxItems":3}},
          "required":["name"],"additionalProperties":false})",
      R"({"type":"object"})",
      R"({"anyOf":[{"type":"integer","minimum":-5,"maximum":125},{"type":"string"}]})",
      R"({"type":"number","minimum":0,"maximum":12})",
      R"({"type":"object","properties":{"kind":{"const":"red"},"a":{"type":"boolean"}},
          "required":["kind"],"additionalProperties":false})",
  };
  for (size_t i = 0; i < schemas.size(); ++i)
    for (uint32_t seed = 0; seed < 4; ++seed) BruteForceWalk(schemas[i], seed);
}

TEST(GrammarMatcherTest, AllowedTokensStayCompletable) {
  // Every token the mask allows leads to a state from which a match is
  // reachable (checked by search over bytes, independent of the mask).
  const auto tokens = SmallTokens();
  auto vocab = TokenVocabulary::FromTokens(tokens);
  std::set<uint8_t> alphabet;
  for (const auto& t : tokens)
    for (char c : t) alphabet.insert(static_cast<uint8_t>(c));
  auto g = CompileJsonSchema(
      nlohmann::json::parse(
          R"({"type":"array","items":{"type":"string","minLength":1,"maxLength":2},"minItems":1})"),
      vocab);
  ASSERT_TRUE(g.ok());
  GrammarMatcher m(*g);
  std::vector<uint64_t> mask(2);
  std::mt19937 rng(7);
  for (int step = 0; step < 30 && !m.complete(); ++step) {
    m.FillMask(mask);
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < tokens.size(); ++t)
      if ((mask[t / 64] >> (t % 64)) & 1) allowed.push_back(static_cast<int32_t>(t));
    for (int32_t t : allowed) {
      GrammarMatcher copy = m;
      ASSERT_TRUE(copy.Advance(t).ok());
      EXPECT_TRUE(Completable(**g, copy.state(), alphabet)) << "token " << tokens[t];
    }
    if (allowed.empty()) break;
    ASSERT_TRUE(m.Advance(allowed[rng() % allowed.size()]).ok());
  }
}

TEST(GrammarMatcherTest, AdvanceRejectsDisallowedTokens) {
  auto vocab = TokenVocabulary::FromTokens(SmallTokens());
  auto g = CompileJsonSchema(nlohmann::json::parse(R"({"type":"boolean"})"), vocab);
  ASSERT_TRUE(g.ok());
  GrammarMatcher m(*g);
  const auto tokens = SmallTokens();
  auto id = [&](const std::string& t) {
    return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
  };
  EXPECT_FALSE(m.Advance(id("{")).ok());
  EXPECT_FALSE(m.Advance(id("")).ok());  // not in the vocabulary
  EXPECT_FALSE(m.Advance(999).ok());     // outside it
  EXPECT_FALSE(m.accepting());
  EXPECT_TRUE(m.Advance(id("tr")).ok());
  EXPECT_FALSE(m.accepting());
  EXPECT_TRUE(m.Advance(id("ue")).ok());
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.complete());
}

// Token edges: ids without bytes (special tokens) allowed and followed by
// id; a spliced grammar called from a larger one.
TEST(GrammarMatcherTest, TokenEdgesAndSplicedGrammars) {
  // Ids 2 and 3 have no bytes, as special tokens in a real vocabulary.
  auto vocab = TokenVocabulary::FromTokens({"a", "b", "", "", "ab"});
  GrammarBuilder inner_b({});
  const int32_t ir = inner_b.NewNode(), ie = inner_b.NewNode();
  inner_b.MarkEnd(ie);
  inner_b.AddLiteral(ir, "ab", ie);
  auto inner = inner_b.Finish(ir, vocab);
  ASSERT_TRUE(inner.ok());
  // <2> "ab" <3>
  GrammarBuilder b({});
  const int32_t r = b.NewNode(), n1 = b.NewNode(), n2 = b.NewNode(), e = b.NewNode();
  b.MarkEnd(e);
  b.AddToken(r, 2, n1);
  b.AddCall(n1, b.Splice(**inner), n2);
  b.AddToken(n2, 3, e);
  auto g = b.Finish(r, vocab);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  GrammarMatcher m(*g);
  std::vector<uint64_t> mask(1);
  m.FillMask(mask);
  EXPECT_EQ(mask[0], uint64_t{1} << 2);
  EXPECT_FALSE(m.Advance(3).ok());
  EXPECT_FALSE(m.Advance(0).ok());
  ASSERT_TRUE(m.Advance(2).ok());
  m.FillMask(mask);
  EXPECT_EQ(mask[0], (uint64_t{1} << 0) | (uint64_t{1} << 4));  // "a", "ab"
  ASSERT_TRUE(m.Advance(4).ok());
  EXPECT_FALSE(m.accepting());
  m.FillMask(mask);
  EXPECT_EQ(mask[0], uint64_t{1} << 3);
  EXPECT_FALSE(m.Advance(2).ok());
  ASSERT_TRUE(m.Advance(3).ok());
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.complete());
}

}  // namespace
}  // namespace agentkv::grammar
