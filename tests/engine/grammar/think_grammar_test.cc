// The <think> block before a constrained reply (Qwen3), on the shipped
// Qwen3 tokenizer: what the prompt says about thinking, what the grammar
// takes, and how a spent reasoning budget closes the block.
#include "engine/grammar/think_grammar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar_constraint.h"

namespace agentkv::grammar {
namespace {

using Json = nlohmann::ordered_json;
using engine::GrammarConstraint;

TEST(ThinkStartOf, FollowsTheTemplatesTail) {
  const std::string gen = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(ThinkStartOf(gen), ThinkStart::kMayOpen);
  // enable_thinking false: the template writes an empty block.
  EXPECT_EQ(ThinkStartOf(gen + "<think>\n\n</think>\n\n"), ThinkStart::kNone);
  // A template that opens the block itself.
  EXPECT_EQ(ThinkStartOf(gen + "<think>\n"), ThinkStart::kOpen);
  EXPECT_EQ(ThinkStartOf(gen + "<think>"), ThinkStart::kOpen);
  EXPECT_EQ(ThinkStartOf(""), ThinkStart::kMayOpen);
  EXPECT_EQ(ThinkStartOf("  \n"), ThinkStart::kMayOpen);
}

class ThinkGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path =
        std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers" / "qwen3" / "tokenizer.json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
    auto tok = text::Tokenizer::Load(path);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(*tok);
    vocab_ = TokenVocabulary::Build(*tok_, tok_->vocab_size());
    eos_ = tok_->TokenToId("<|im_end|>").value_or(-1);
    close_ = tok_->TokenToId("</think>").value_or(-1);
    ASSERT_GE(eos_, 0);
    ASSERT_GE(close_, 0);
    auto content = CompileJsonSchema(
        Json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],)"
                    R"("additionalProperties":false})"),
        vocab_);
    ASSERT_TRUE(content.ok()) << content.status().ToString();
    content_ = *content;
  }

  std::shared_ptr<const Grammar> Think(ThinkStart start) const {
    auto g = CompileThinkThenGrammar(*content_, start, vocab_);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return g.ok() ? *g : nullptr;
  }

  std::vector<int32_t> Ids(const std::string& text) const { return tok_->Encode(text, false); }

  // Whether the matcher takes all of `text` (its tokens one by one).
  bool Takes(const std::shared_ptr<const Grammar>& g, const std::string& text,
             bool* accepting = nullptr) const {
    GrammarMatcher m(g);
    for (int32_t id : Ids(text))
      if (!m.Advance(id).ok()) return false;
    if (accepting != nullptr) *accepting = m.accepting();
    return true;
  }

  // The tokens the constraint allows next.
  std::vector<int32_t> Allowed(GrammarConstraint& c) const {
    std::vector<float> logits(static_cast<size_t>(vocab_->vocab_size()), 0.0f);
    c.Apply(logits);
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < vocab_->vocab_size(); ++i)
      if (std::isfinite(logits[static_cast<size_t>(i)])) ids.push_back(i);
    return ids;
  }
  // Every allowed token's bytes continue `rest` (what is left of a tag).
  bool AllContinue(const std::vector<int32_t>& ids, const std::string& rest) const {
    for (int32_t id : ids) {
      const std::string b = tok_->TokenBytes(id).value_or("");
      if (b.empty() || b.size() > rest.size() || rest.compare(0, b.size(), b) != 0) return false;
    }
    return true;
  }

  std::unique_ptr<text::Tokenizer> tok_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::shared_ptr<const Grammar> content_;
  int32_t eos_ = -1, close_ = -1;
};

TEST_F(ThinkGrammarTest, ABlockThenTheAnswerOrTheAnswerAlone) {
  auto g = Think(ThinkStart::kMayOpen);
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->has_reasoning());
  bool accepting = false;
  for (const char* reply :
       {"<think>\nThe user wants a number; 7 < 9 and a <b>tag</b> or </thin is fine.\n</think>\n\n"
        "{\"n\": 7}",
        "<think></think>{\"n\":1}", "{\"n\": 3}"}) {
    EXPECT_TRUE(Takes(g, reply, &accepting)) << reply;
    EXPECT_TRUE(accepting) << reply;
  }
  // The tags as Qwen3's own tokens and in pieces alike.
  ASSERT_EQ(Ids("<think>").size(), 1u);
  GrammarMatcher m(g);
  ASSERT_TRUE(m.Advance(Ids("<think>")[0]).ok());
  ASSERT_TRUE(m.AdvanceBytes("hmm").ok());
  ASSERT_TRUE(m.Advance(close_).ok());
  ASSERT_TRUE(m.AdvanceBytes("{\"n\":2}").ok());
  EXPECT_TRUE(m.accepting());
  GrammarMatcher p(g);
  for (const char* piece : {"<", "think>hmm</", "think>", "{\"n\":2}"})
    ASSERT_TRUE(p.AdvanceBytes(piece).ok()) << piece;
  EXPECT_TRUE(p.accepting());
  // Not taken: a second block, text after the closing tag that is not the
  // answer, the answer inside the block only, a block that never closes.
  for (const char* reply : {"<think>a</think><think>b</think>{\"n\":1}",
                            "<think>a</think>so: {\"n\":1}", "{\"n\":1}<think>x</think>"}) {
    EXPECT_FALSE(Takes(g, reply)) << reply;
  }
  EXPECT_TRUE(Takes(g, "<think>{\"n\":1}", &accepting));
  EXPECT_FALSE(accepting) << "an open block is not an answer";
  // kNone is not a grammar.
  EXPECT_FALSE(CompileThinkThenGrammar(*content_, ThinkStart::kNone, vocab_).ok());
}

TEST_F(ThinkGrammarTest, AnOpenedBlockMustClose) {
  auto g = Think(ThinkStart::kOpen);
  ASSERT_TRUE(g);
  bool accepting = false;
  EXPECT_TRUE(Takes(g, "\nOkay.\n</think>\n\n{\"n\": 7}", &accepting));
  EXPECT_TRUE(accepting);
  EXPECT_TRUE(Takes(g, "{\"n\": 7}", &accepting)) << "reasoning text that looks like JSON";
  EXPECT_FALSE(accepting);
  EXPECT_FALSE(Takes(g, "<think>x</think>{\"n\":1}</think>{\"n\":2}"));
}

// A spent budget inside the block: only the closing tag may come (the
// rest of it where the text ends in its start), then the answer; a spent
// budget before the block opens none.
TEST_F(ThinkGrammarTest, ASpentBudgetClosesTheBlock) {
  auto g = Think(ThinkStart::kMayOpen);
  ASSERT_TRUE(g);
  const int32_t budget = 8;
  const std::vector<int32_t> thinking =
      Ids("<think>\nLet me think about which number to give here, carefully.");
  ASSERT_GT(thinking.size(), static_cast<size_t>(budget));
  GrammarConstraint c(g, {eos_}, budget);
  size_t i = 0;
  for (; c.reasoning_tokens() < budget; ++i) {
    ASSERT_LT(i, thinking.size());
    if (i > 0) {
      EXPECT_GT(Allowed(c).size(), 100000u) << "free text before the budget is spent";
    }
    c.Accept(thinking[i]);
  }
  EXPECT_EQ(c.reasoning_tokens(), budget);
  std::vector<int32_t> allowed = Allowed(c);
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), close_), allowed.end());
  EXPECT_TRUE(AllContinue(allowed, "</think>"));
  // Half the tag written before the budget ran out: only its rest.
  {
    GrammarConstraint h(g, {eos_}, 3);
    for (int32_t id : Ids("<think>ok </")) h.Accept(id);
    ASSERT_GE(h.reasoning_tokens(), 3);
    const std::vector<int32_t> rest = Allowed(h);
    EXPECT_FALSE(rest.empty());
    // "</" may end the text, the tag whole then, or be the tag's start.
    for (int32_t id : rest) {
      const std::string b = tok_->TokenBytes(id).value_or("");
      EXPECT_TRUE(std::string("think>").starts_with(b) || std::string("</think>").starts_with(b))
          << b;
    }
  }
  const int32_t spent = c.reasoning_tokens();
  for (int32_t id : Ids("</think>\n\n{\"n\": 7}")) {
    allowed = Allowed(c);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), id), allowed.end()) << id;
    c.Accept(id);
  }
  EXPECT_TRUE(c.matcher().accepting());
  EXPECT_EQ(c.reasoning_tokens(), spent) << "the answer is not reasoning";
  // Budget 0: no block at all; the answer's first tokens are allowed.
  GrammarConstraint z(g, {eos_}, 0);
  allowed = Allowed(z);
  EXPECT_EQ(std::find(allowed.begin(), allowed.end(), Ids("<think>")[0]), allowed.end());
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), Ids("{")[0]), allowed.end());
  // And an opened block with budget 0 closes at once.
  GrammarConstraint o(Think(ThinkStart::kOpen), {eos_}, 0);
  EXPECT_TRUE(AllContinue(Allowed(o), "</think>"));
}

}  // namespace
}  // namespace agentkv::grammar
