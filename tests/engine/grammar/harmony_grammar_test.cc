#include "engine/grammar/harmony_grammar.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar_constraint.h"

namespace agentkv::grammar {
namespace {

using Json = nlohmann::ordered_json;

class HarmonyGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path =
        std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers" / "gptoss" / "tokenizer.json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
    auto tok = text::Tokenizer::Load(path);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(*tok);
    vocab_ = TokenVocabulary::Build(*tok_, tok_->vocab_size());
    auto t = HarmonyTokens::Find(*tok_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    t_ = *t;
    ret_ = tok_->TokenToId("<|return|>").value_or(-1);
    ASSERT_GE(ret_, 0);
  }

  std::vector<ToolGrammarSpec> Tools() const {
    ToolGrammarSpec w;
    w.name = "get_weather";
    w.parameters = Json::parse(
        R"({"type":"object","properties":{"city":{"type":"string","maxLength":20},)"
        R"("unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false})");
    ToolGrammarSpec t;
    t.name = "get_time";
    t.parameters = Json::parse(
        R"({"type":"object","properties":{"zone":{"type":"integer","minimum":-12,"maximum":14}},)"
        R"("required":["zone"],"additionalProperties":false})");
    return {w, t};
  }

  std::shared_ptr<const Grammar> ToolGrammar(bool required) const {
    auto g = CompileHarmonyToolCallGrammar(Tools(), required, t_, vocab_);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return g.ok() ? *g : nullptr;
  }

  std::vector<uint64_t> Mask(GrammarMatcher& m) const {
    std::vector<uint64_t> mask((static_cast<size_t>(vocab_->vocab_size()) + 63) / 64);
    m.FillMask(mask);
    return mask;
  }
  static bool Has(const std::vector<uint64_t>& mask, int32_t id) {
    return (mask[static_cast<size_t>(id) / 64] >> (id % 64)) & 1;
  }

  // Feeds `text`'s tokens one by one, checking each is in the mask first.
  // OK when all are taken; else the first refusal.
  Status Feed(GrammarMatcher& m, const std::string& text) const {
    for (int32_t id : tok_->Encode(text, false)) {
      const bool allowed = Has(Mask(m), id);
      Status s = m.Advance(id);
      if (allowed != s.ok()) ADD_FAILURE() << "mask and Advance disagree on token " << id;
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }

  std::unique_ptr<text::Tokenizer> tok_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  HarmonyTokens t_;
  int32_t ret_ = -1;
};

constexpr const char* kReasoning =
    "<|channel|>analysis<|message|>The user wants the weather; call the tool.<|end|>"
    "<|start|>assistant";

TEST_F(HarmonyGrammarTest, RequiredCallIsAcceptedInBothHeaderForms) {
  auto g = ToolGrammar(true);
  ASSERT_TRUE(g);
  for (const char* call :
       {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        "{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>",
        " to=functions.get_time<|channel|>commentary json<|message|>{\"zone\":-3}<|call|>"}) {
    for (const std::string& pre : {std::string(), std::string(kReasoning)}) {
      GrammarMatcher m(g);
      ASSERT_TRUE(Feed(m, pre + call).ok()) << pre + call;
      EXPECT_TRUE(m.accepting());
      EXPECT_TRUE(m.complete());
    }
  }
}

TEST_F(HarmonyGrammarTest, AllowedNextTokens) {
  auto g = ToolGrammar(true);
  ASSERT_TRUE(g);
  GrammarMatcher m(g);
  auto mask = Mask(m);
  // The header: a channel, or a recipient first; no body, no other marker.
  EXPECT_TRUE(Has(mask, t_.channel));
  for (int32_t id : {t_.message, t_.end, t_.start, t_.call, t_.constrain, ret_})
    EXPECT_FALSE(Has(mask, id)) << id;
  const auto word = [&](const char* s) {
    auto ids = tok_->Encode(s, false);
    EXPECT_EQ(ids.size(), 1u) << s;
    return ids.front();
  };
  EXPECT_TRUE(Has(mask, word(" to")));
  EXPECT_FALSE(Has(mask, word("hello")));
  ASSERT_TRUE(m.Advance(t_.channel).ok());
  mask = Mask(m);
  EXPECT_TRUE(Has(mask, word("analysis")));
  EXPECT_TRUE(Has(mask, word("comment")));
  EXPECT_FALSE(Has(mask, word("final")));  // a required call has no answer
  EXPECT_FALSE(Has(mask, t_.channel));
  // Once the arguments close, only <|call|> (never <|return|>) ends it.
  ASSERT_TRUE(
      Feed(m, "commentary to=functions.get_time <|constrain|>json<|message|>{\"zone\":1}").ok());
  EXPECT_FALSE(m.accepting());
  mask = Mask(m);
  EXPECT_TRUE(Has(mask, t_.call));
  EXPECT_FALSE(Has(mask, ret_));
  EXPECT_FALSE(Has(mask, t_.end));
  // The sampler's view: end tokens other than <|call|> stay masked.
  engine::GrammarConstraint c(g, {ret_, t_.call});
  for (int32_t id : tok_->Encode(
           "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"zone\":1}",
           false))
    c.Accept(id);
  std::vector<float> logits(static_cast<size_t>(vocab_->vocab_size()), 0.0f);
  c.Apply(logits);
  EXPECT_EQ(logits[static_cast<size_t>(t_.call)], 0.0f);
  EXPECT_TRUE(std::isinf(logits[static_cast<size_t>(ret_)]));
}

TEST_F(HarmonyGrammarTest, WrongNameBadArgumentsAndEarlyStopsAreRejected) {
  auto g = ToolGrammar(true);
  ASSERT_TRUE(g);
  const std::string head = "<|channel|>commentary to=functions.";
  {
    GrammarMatcher m(g);
    EXPECT_FALSE(Feed(m, head + "get_stock <|constrain|>json<|message|>{}<|call|>").ok());
  }
  {
    GrammarMatcher m(g);  // a forbidden property, a wrong type, an enum miss
    EXPECT_FALSE(
        Feed(m, head + "get_weather <|constrain|>json<|message|>{\"city\":\"x\",\"zip\":1}").ok());
    GrammarMatcher m2(g);
    EXPECT_FALSE(Feed(m2, head + "get_time <|constrain|>json<|message|>{\"zone\":\"3\"}").ok());
    GrammarMatcher m3(g);
    EXPECT_FALSE(
        Feed(m3, head + "get_weather <|constrain|>json<|message|>{\"city\":\"x\",\"unit\":\"k\"")
            .ok());
  }
  {
    GrammarMatcher m(g);  // the required property missing: "}" cannot come
    ASSERT_TRUE(Feed(m, head + "get_time <|constrain|>json<|message|>{").ok());
    EXPECT_FALSE(Feed(m, "}").ok());
  }
  {
    // No prefix of a call is a complete output; a call must end in <|call|>.
    GrammarMatcher m(g);
    for (int32_t id : tok_->Encode(
             std::string(kReasoning) + head + "get_time <|constrain|>json<|message|>{\"zone\":2}",
             false)) {
      EXPECT_FALSE(m.accepting());
      ASSERT_TRUE(m.Advance(id).ok());
    }
    EXPECT_FALSE(m.accepting());
    EXPECT_FALSE(m.Advance(ret_).ok());
    EXPECT_FALSE(m.Advance(t_.end).ok());
  }
  {
    GrammarMatcher m(g);  // reasoning cannot spell a marker in plain bytes
    EXPECT_FALSE(Feed(m, "<|channel|>analysis<|message|>a <|end|").ok());
    GrammarMatcher m2(g);
    ASSERT_TRUE(m2.Advance(t_.channel).ok());
    ASSERT_TRUE(Feed(m2, "analysis<|message|>").ok());
    EXPECT_FALSE(m2.AdvanceBytes("<|").ok());
    EXPECT_TRUE(m2.AdvanceBytes("< |").ok());
  }
}

TEST_F(HarmonyGrammarTest, AutoAllowsAnAnswerOrACall) {
  auto g = ToolGrammar(false);
  ASSERT_TRUE(g);
  {
    GrammarMatcher m(g);
    ASSERT_TRUE(Feed(m, std::string(kReasoning) +
                            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
                            "<|channel|>final<|message|>It is sunny.")
                    .ok());
    EXPECT_TRUE(m.accepting());
  }
  {
    GrammarMatcher m(g);
    ASSERT_TRUE(Feed(m,
                     "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                     "<|message|>{\"city\":\"Oslo\"}<|call|>")
                    .ok());
    EXPECT_TRUE(m.complete());
    GrammarMatcher m2(g);  // strict arguments still follow the schema
    EXPECT_FALSE(Feed(m2,
                      "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                      "<|message|>{\"town\":\"Oslo\"}")
                     .ok());
  }
}

TEST_F(HarmonyGrammarTest, UnconstrainedArgumentsAreAnyObject) {
  auto tools = Tools();
  tools[0].constrain_arguments = false;
  auto g = CompileHarmonyToolCallGrammar(tools, true, t_, vocab_);
  ASSERT_TRUE(g.ok());
  GrammarMatcher m(*g);
  EXPECT_TRUE(Feed(m,
                   "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                   "<|message|>{\"town\": [1, 2]}<|call|>")
                  .ok());
  GrammarMatcher m2(*g);
  EXPECT_FALSE(Feed(m2,
                    "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                    "<|message|>[1]")
                   .ok());
}

TEST_F(HarmonyGrammarTest, FinalAnswerFollowsTheSchema) {
  auto content = CompileJsonSchema(
      Json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})"),
      vocab_);
  ASSERT_TRUE(content.ok());
  auto g = CompileHarmonyFinalGrammar(**content, t_, vocab_);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  {
    GrammarMatcher m(*g);
    ASSERT_TRUE(Feed(m, std::string(kReasoning) + "<|channel|>final<|message|>{\"n\": 4").ok());
    EXPECT_FALSE(m.accepting());
    ASSERT_TRUE(Feed(m, "}").ok());
    EXPECT_TRUE(m.accepting());
  }
  GrammarMatcher m(*g);
  EXPECT_FALSE(Feed(m, "<|channel|>final<|message|>The answer").ok());
  GrammarMatcher m2(*g);
  EXPECT_FALSE(Feed(m2, "<|channel|>commentary to=functions.x<|message|>{}").ok());
  GrammarMatcher m3(*g);
  EXPECT_FALSE(Feed(m3, "<|channel|>final<|message|>{\"n\": 1.5}").ok());
}

TEST_F(HarmonyGrammarTest, Errors) {
  auto tools = Tools();
  tools[1].name = "two words";
  EXPECT_FALSE(CompileHarmonyToolCallGrammar(tools, true, t_, vocab_).ok());
  tools[1].name = "bad";
  tools[1].parameters = Json::parse(R"({"type":"object","not":{}})");
  auto bad = CompileHarmonyToolCallGrammar(tools, true, t_, vocab_);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not"), std::string::npos);
  EXPECT_FALSE(CompileHarmonyToolCallGrammar({}, true, t_, vocab_).ok());
  HarmonyTokens missing = t_;
  missing.call = -1;
  EXPECT_FALSE(CompileHarmonyToolCallGrammar(Tools(), true, missing, vocab_).ok());
  // A token edge must name a token without bytes inside the vocabulary.
  GrammarBuilder b({});
  const int32_t r = b.NewNode(), e = b.NewNode();
  b.MarkEnd(e);
  b.AddToken(r, tok_->Encode("a", false).front(), e);
  EXPECT_FALSE(b.Finish(r, vocab_).ok());
  GrammarBuilder b2({});
  const int32_t r2 = b2.NewNode(), e2 = b2.NewNode();
  b2.MarkEnd(e2);
  b2.AddToken(r2, vocab_->vocab_size(), e2);
  EXPECT_FALSE(b2.Finish(r2, vocab_).ok());
  // The node limit covers spliced grammars.
  auto big = CompileHarmonyToolCallGrammar(Tools(), true, t_, vocab_, GrammarLimits{200, 48});
  EXPECT_FALSE(big.ok());
}

TEST_F(HarmonyGrammarTest, NotAHarmonyTokenizer) {
  const auto path =
      std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers" / "qwen3" / "tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto tok = text::Tokenizer::Load(path);
  ASSERT_TRUE(tok.ok());
  EXPECT_FALSE(HarmonyTokens::Find(**tok).ok());
}

}  // namespace
}  // namespace agentkv::grammar
