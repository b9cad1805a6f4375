// StreamDetokenizer: pieces are valid UTF-8 and their concatenation equals
// Tokenizer::Decode of all ids, on real tokenizers (byte-level, byte
// fallback, clean-up of spaces) and a Metaspace one.
#include "engine/text/stream_detokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

// Streams `ids` and checks every piece and the total.
void ExpectStreamsLikeDecode(const Tokenizer& t, const Ids& ids, bool skip_special,
                             const std::string& what) {
  StreamDetokenizer s(t, skip_special);
  std::string all;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = s.Push(ids[i]);
    ASSERT_TRUE(tokenizer_unicode::IsValidUtf8(piece)) << what << " after id #" << i;
    all += piece;
  }
  all += s.Flush();
  ASSERT_EQ(all, t.Decode(ids, skip_special)) << what;
}

std::vector<std::string> Texts() {
  std::vector<std::string> texts = {
      "Hello world, it's a test . Don 't , isn't ! ok ?",
      "日本語のテキスト 😀👨‍👩‍👧 café e\xCC\x81 "
      "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
      "    def f(x):\n\treturn x  .  \n\n\n",
      "<|im_start|>user\nhi<|im_end|>\n<start_of_turn>model\n<bos> x",
      "\xE4\xB8\x80\xE4\xB8\x81\xE4\xB8\x82\xE4\xB8\x83 \xF0\xA0\x80\x80\xF0\xAA\x9B\x96",
      " ' s 'm n't 're 've  .",
      "",
  };
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {
      "a",  " ",  ".", "'", "n", "t", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xE6\x97\xA5",
      "\n", "ve", "re"};
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 20); k < n; ++k)
      s += parts[rng() % parts.size()];
    texts.push_back(s);
  }
  return texts;
}

class StreamDetokenizerRealTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamDetokenizerRealTest, ConcatenationEqualsDecode) {
  auto path = fs::path(AGENTKV_DATA_DIR) / "tokenizers" / GetParam() / "tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing (run scripts/setup.sh)";
  auto loaded = Tokenizer::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& t = **loaded;
  for (const auto& text : Texts()) {
    Ids ids = t.Encode(text, true);
    ExpectStreamsLikeDecode(t, ids, true, GetParam() + " text: " + text);
    ExpectStreamsLikeDecode(t, ids, false, GetParam() + " text: " + text);
  }
  // Random ids: lone continuation bytes, byte-fallback tokens, specials.
  std::mt19937 rng(11);
  for (int rep = 0; rep < 300; ++rep) {
    Ids ids;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 12); k < n; ++k) {
      switch (rng() % 4) {
        case 0:
          ids.push_back(static_cast<int32_t>(rng() % t.vocab_size()));
          break;
        case 1:
          ids.push_back(static_cast<int32_t>(rng() % 512));
          break;  // byte-ish tokens
        case 2: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "<0x%02X>", static_cast<int>(rng() % 256));
          auto id = t.TokenToId(hex);
          ids.push_back(id ? *id : 0);
          break;
        }
        default:
          ids.push_back(t.vocab_size() - 1 - static_cast<int32_t>(rng() % 30));
      }
    }
    ExpectStreamsLikeDecode(t, ids, rep % 2 == 0, GetParam() + " random ids");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTokenizers, StreamDetokenizerRealTest,
                         ::testing::Values("qwen3", "llama3_1", "gemma3"),
                         [](const auto& info) { return info.param; });

TEST(StreamDetokenizerTest, HoldsBackIncompleteUtf8AndCleanupPrefixes) {
  auto path = fs::path(AGENTKV_DATA_DIR) / "tokenizers/llama3_1/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing";
  auto loaded = Tokenizer::Load(path);
  ASSERT_TRUE(loaded.ok());
  const Tokenizer& t = **loaded;
  ASSERT_TRUE(t.cleans_up_tokenization_spaces());
  // Byte-level tokens for the three bytes of the euro sign.
  auto b0 = t.TokenToId("\xC3\xA2"), b1 = t.TokenToId("\xC4\xA4"), b2 = t.TokenToId("\xC2\xAC");
  ASSERT_TRUE(b0 && b1 && b2);
  StreamDetokenizer s(t);
  EXPECT_EQ(s.Push(*b0), "");
  EXPECT_EQ(s.Push(*b1), "");
  EXPECT_EQ(s.Push(*b2), "\xE2\x82\xAC");
  // " " may turn into "" if "." follows (clean_up_tokenization_spaces).
  auto space = t.TokenToId("\xC4\xA0");  // GPT-2's form of " "
  auto dot = t.TokenToId(".");
  ASSERT_TRUE(space && dot);
  EXPECT_EQ(s.Push(*space), "");
  EXPECT_EQ(s.Push(*dot), ".");
  EXPECT_EQ(s.Push(*space), "");
  EXPECT_EQ(s.Flush(), " ");
}

TEST(StreamDetokenizerTest, MetaspaceFirstTokenAfterSkippedSpecial) {
  const std::string json = R"({"added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "normalizer": null, "post_processor": null,
    "pre_tokenizer": {"type": "Metaspace", "replacement": "_", "add_prefix_space": true},
    "decoder": {"type": "Metaspace", "replacement": "_", "add_prefix_space": true},
    "model": {"type": "BPE", "vocab": {"_a": 0, "_b": 1, "_": 2, "<s>": 3}, "merges": []}})";
  auto loaded = Tokenizer::FromJson(json, "", "metaspace");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& t = **loaded;
  for (bool skip : {true, false}) {
    for (const Ids& ids : {Ids{3, 0, 1}, Ids{0, 1}, Ids{2, 0}, Ids{3, 3, 2, 2, 1}}) {
      ExpectStreamsLikeDecode(t, ids, skip, "metaspace");
    }
  }
  StreamDetokenizer s(t);
  EXPECT_EQ(s.Push(3), "");
  EXPECT_EQ(s.Push(0), "a");
  EXPECT_EQ(s.Push(1), " b");
}

}  // namespace
}  // namespace agentkv::text
