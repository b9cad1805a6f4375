#include "engine/grammar/token_vocabulary.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace agentkv::grammar {
namespace {

TEST(TokenVocabularyTest, PlainCharsAndTries) {
  EXPECT_EQ(PlainJsonChars("abc"), 3);
  EXPECT_EQ(PlainJsonChars("\xC3\xA9x"), 2);
  EXPECT_EQ(PlainJsonChars("\xC3"), -1);
  EXPECT_EQ(PlainJsonChars("a\""), -1);
  EXPECT_EQ(PlainJsonChars("\\"), -1);
  EXPECT_EQ(PlainJsonChars("\x1f"), -1);
  EXPECT_EQ(PlainJsonChars("\xED\xA0\x80"), -1);  // a surrogate
  auto v = TokenVocabulary::FromTokens({"ab", "a", "", "\"", "abc", "b"});
  EXPECT_FALSE(v->has(2));
  // Every token's bytes spell a path ending at a node holding it.
  const auto& t = v->all();
  EXPECT_EQ(t.token_ids.size(), 5u);
  EXPECT_EQ(v->non_plain().token_ids.size(), 1u);
  EXPECT_EQ(v->plain_by_chars().front(), 1);  // "a" or "b": one char, lowest id first
  for (size_t i = 1; i < t.byte.size(); ++i) EXPECT_GT(t.subtree_end[i], static_cast<int32_t>(i));
}

TEST(TokenVocabularyTest, QwenTokenizerSkipsSpecialTokens) {
  const auto path =
      std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers" / "qwen3" / "tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto tok = text::Tokenizer::Load(path);
  ASSERT_TRUE(tok.ok());
  auto v = TokenVocabulary::Build(**tok, (*tok)->vocab_size());
  const auto eos = (*tok)->eos_id();
  ASSERT_TRUE(eos.has_value());
  EXPECT_FALSE(v->has(*eos));
  const auto ids = (*tok)->Encode("{\"key\": \"value\"}", false);
  std::string joined;
  for (int32_t id : ids) {
    ASSERT_TRUE(v->has(id));
    joined += v->bytes(id);
  }
  EXPECT_EQ(joined, "{\"key\": \"value\"}");
}

}  // namespace
}  // namespace agentkv::grammar
