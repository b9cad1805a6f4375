// Unit tests of Tokenizer: error paths, BPE merge order and formats, byte
// fallback, added tokens, invalid UTF-8, thread safety, the CLI. Identity
// with the reference on real tokenizers is tokenizer_reference_test.cc.
#include "engine/text/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <deque>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/text/pretokenizer.h"
#include "engine/text/tokenizer_regex.h"
#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {
namespace {

namespace fs = std::filesystem;
const fs::path kData = AGENTKV_DATA_DIR;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("agentkv_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path Write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
    return path_ / name;
  }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// A tiny SentencePiece-style BPE over letters with the given merges JSON.
std::string TinyJson(const std::string& merges, const std::string& extra_model = "",
                     const std::string& pre = "null", const std::string& added = "[]",
                     const std::string& decoder = "null") {
  return R"({"added_tokens": )" + added + R"(, "normalizer": null, "pre_tokenizer": )" + pre +
         R"(, "post_processor": null, "decoder": )" + decoder +
         R"(, "model": {"type": "BPE", "unk_token": "<unk>", )" + extra_model +
         R"("vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "bc": 5, "abc": 6,
                      "aa": 7, "aaaa": 8, " ": 9, "<0xC3>": 10, "<0xA9>": 11, "X": 12},
            "merges": )" +
         merges + "}}";
}

std::unique_ptr<Tokenizer> MustLoad(const std::string& json) {
  auto t = Tokenizer::FromJson(json, "", "tiny");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::unique_ptr<Tokenizer> LoadReal(const std::string& name) {
  auto path = kData / "tokenizers" / name / "tokenizer.json";
  if (!fs::exists(path)) return nullptr;
  auto t = Tokenizer::Load(path);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

using Ids = std::vector<int32_t>;

TEST(TokenizerLoadTest, MissingFileIsNotFoundNamingThePath) {
  auto t = Tokenizer::Load("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoadTest, MalformedJsonIsCorruptionNamingTheFile) {
  TempDir dir;
  auto path = dir.Write("tokenizer.json", "{\"model\": {");
  auto t = Tokenizer::Load(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find(path.string()), std::string::npos);
  EXPECT_NE(t.status().message().find("malformed JSON"), std::string::npos);
}

TEST(TokenizerLoadTest, MalformedConfigBesideIsCorruptionNamingTheConfig) {
  TempDir dir;
  auto path = dir.Write("tokenizer.json", TinyJson("[]"));
  auto config = dir.Write("tokenizer_config.json", "{not json");
  auto t = Tokenizer::Load(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find(config.string()), std::string::npos);
}

TEST(TokenizerLoadTest, UnsupportedPartsAreUnimplementedNamingTypeAndFile) {
  struct Case {
    std::string json, type;
  };
  std::string base = TinyJson("[]");
  auto with = [&](const std::string& key, const std::string& value) {
    std::string j = base;
    size_t pos = j.find("\"" + key + "\": ");
    size_t end = j.find(",", pos);
    return j.substr(0, pos) + "\"" + key + "\": " + value + j.substr(end);
  };
  std::vector<Case> cases = {
      {with("pre_tokenizer", R"({"type": "BertPreTokenizer"})"), "BertPreTokenizer"},
      {with("normalizer", R"({"type": "Precompiled", "precompiled_charsmap": ""})"), "Precompiled"},
      {with("decoder", R"({"type": "WordPiece", "prefix": "##"})"), "WordPiece"},
      {with("post_processor", R"({"type": "RobertaProcessing"})"), "RobertaProcessing"},
      {R"({"added_tokens": [], "model": {"type": "Unigram", "vocab": []}})", "Unigram"},
  };
  TempDir dir;
  for (const auto& c : cases) {
    auto path = dir.Write("tokenizer.json", c.json);
    auto t = Tokenizer::Load(path);
    ASSERT_FALSE(t.ok()) << c.type;
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << t.status().ToString();
    EXPECT_NE(t.status().message().find(c.type), std::string::npos) << t.status().ToString();
    EXPECT_NE(t.status().message().find(path.string()), std::string::npos);
  }
}

TEST(TokenizerLoadTest, WrongShapesAreCorruption) {
  for (
      std::string json : {
          std::string(R"([1, 2])"),
          std::string(R"({"model": {"type": "BPE", "vocab": [], "merges": []}})"),
          std::string(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})"),
          std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [3]}})"),
          std::string(
              R"({"added_tokens": [{"id": 1}], "model": {"type": "BPE", "vocab": {}, "merges": []}})"),
          std::string(R"({"normalizer": null})"),
      }) {
    auto t = Tokenizer::FromJson(json, "", "bad.json");
    ASSERT_FALSE(t.ok()) << json;
    EXPECT_EQ(t.status().code(), StatusCode::kCorruption) << t.status().ToString();
    EXPECT_NE(t.status().message().find("bad.json"), std::string::npos);
  }
}

TEST(TokenizerLoadTest, BadRegexIsReported) {
  auto t = Tokenizer::FromJson(
      TinyJson(
          "[]", "",
          R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false})"),
      "", "re.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("re.json"), std::string::npos);
}

TEST(TokenizerBpeTest, MergesApplyByRankNotPosition) {
  // "b c" outranks "a b", so "abc" is a + bc, then a bc -> abc.
  auto t = MustLoad(TinyJson(R"([["b", "c"], ["a", "b"], ["a", "bc"]])"));
  EXPECT_EQ(t->Encode("abc", false), Ids{6});
  // Without "a bc", it stops at a + bc.
  auto t2 = MustLoad(TinyJson(R"([["b", "c"], ["a", "b"]])"));
  EXPECT_EQ(t2->Encode("abc", false), (Ids{1, 5}));
  // "a b" first: ab + c, and there is no "ab c".
  auto t3 = MustLoad(TinyJson(R"([["a", "b"], ["b", "c"]])"));
  EXPECT_EQ(t3->Encode("abc", false), (Ids{4, 3}));
}

TEST(TokenizerBpeTest, StringAndArrayMergeFormatsAgree) {
  auto a = MustLoad(TinyJson(R"(["b c", "a b", "a bc"])"));
  auto b = MustLoad(TinyJson(R"([["b", "c"], ["a", "b"], ["a", "bc"]])"));
  for (std::string s : {"abc", "cba", "abcabc", "aabbcc", "bcab"})
    EXPECT_EQ(a->Encode(s, false), b->Encode(s, false)) << s;
}

TEST(TokenizerBpeTest, EqualRanksMergeLeftmostFirstInShortAndLongWords) {
  auto t = MustLoad(TinyJson(R"([["a", "a"], ["aa", "aa"]])"));
  // Short words take the scan path, long ones (> 48 symbols) the heap path;
  // both must give ceil-left pairings.
  for (int n : {3, 5, 40, 49, 100, 101, 1001}) {
    Ids want(n / 4, 8);
    if (n % 4 >= 2) want.push_back(7);
    if (n % 2 == 1) want.push_back(1);
    EXPECT_EQ(t->Encode(std::string(n, 'a'), false), want) << n;
  }
}

TEST(TokenizerBpeTest, ByteFallbackAndUnknown) {
  auto t = MustLoad(TinyJson(R"([])", R"("byte_fallback": true, "fuse_unk": true, )"));
  // é is not in the vocabulary but its bytes are.
  EXPECT_EQ(t->Encode("\xC3\xA9", false), (Ids{10, 11}));
  // ü's bytes (C3 BC) are not all there: unknown, and runs of unknowns fuse.
  EXPECT_EQ(t->Encode("a\xC3\xBC\xC3\xBC"
                      "b",
                      false),
            (Ids{1, 0, 2}));
  auto nofb = MustLoad(TinyJson(R"([])"));
  EXPECT_EQ(nofb->Encode("a\xC3\xA9", false), (Ids{1, 0}));
}

TEST(TokenizerAddedTokensTest, SplitLongestFirstWithStrip) {
  std::string added = R"([{"id": 13, "content": "<s>", "special": true},
      {"id": 14, "content": "<s>x", "special": false},
      {"id": 15, "content": "[L]", "lstrip": true, "special": false},
      {"id": 16, "content": "[R]", "rstrip": true, "special": false}])";
  auto t = MustLoad(TinyJson("[]", "", "null", added));
  EXPECT_EQ(t->Encode("a<s>b", false), (Ids{1, 13, 2}));
  EXPECT_EQ(t->Encode("<s>xa", false), (Ids{14, 1}));               // longest match
  EXPECT_EQ(t->Encode("a  [L]  b", false), (Ids{1, 15, 9, 9, 2}));  // left side trimmed
  EXPECT_EQ(t->Encode("a  [R]  b", false), (Ids{1, 9, 9, 16, 2}));  // right side trimmed
  EXPECT_EQ(t->Encode("<s", false), (Ids{0, 0}));                   // no unk fusing by default
  EXPECT_TRUE(t->IsSpecial(13));
  EXPECT_FALSE(t->IsSpecial(14));
  EXPECT_EQ(t->TokenToId("<s>x"), 14);
  EXPECT_EQ(t->IdToToken(15), "[L]");
  EXPECT_EQ(t->IdToToken(99), "");
  EXPECT_EQ(t->vocab_size(), 17);
  // Special tokens are kept or skipped on decode; the null decoder joins
  // tokens with spaces.
  EXPECT_EQ(t->Decode(Ids{1, 13, 2}, false), "a <s> b");
  EXPECT_EQ(t->Decode(Ids{1, 13, 2}, true), "a b");
}

TEST(TokenizerDecodeTest, MetaspaceStripsOnlyTheSequenceStart) {
  auto t = MustLoad(TinyJson(
      "[]", "",
      R"({"type": "Metaspace", "replacement": "X", "prepend_scheme": "always", "add_prefix_space": true})",
      "[]", R"({"type": "Metaspace", "replacement": "X", "add_prefix_space": true})"));
  // " a" -> "Xa" with the prefix; "a b" -> "XaXb".
  EXPECT_EQ(t->Encode("a b", false), (Ids{12, 1, 12, 2}));
  EXPECT_EQ(t->Decode(Ids{12, 1, 12, 2}), "a b");
  EXPECT_EQ(t->DecodeFragment(Ids{12, 1}, false, false), " a");
}

TEST(TokenizerRealTest, InvalidUtf8IsReplacedNotFatal) {
  auto t = LoadReal("qwen3");
  if (!t) GTEST_SKIP() << "data/tokenizers/qwen3 missing (run scripts/setup.sh)";
  EXPECT_EQ(t->Encode("a\xFF"
                      "b",
                      false),
            t->Encode("a\xEF\xBF\xBD"
                      "b",
                      false));
  EXPECT_EQ(t->Encode("\xE2\x82", false), t->Encode("\xEF\xBF\xBD", false));
  EXPECT_EQ(t->Encode("\xED\xA0\x80", false),  // a surrogate: three replacements
            t->Encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", false));
  // Decoding byte-level ids that cut a character in half yields U+FFFD.
  auto ids = t->Encode("\xE2\x82\xAC", false);  // the euro sign
  ASSERT_FALSE(ids.empty());
  std::string all = t->Decode(ids);
  EXPECT_EQ(all, "\xE2\x82\xAC");
  auto byte_e2 = t->TokenToId("\xC3\xA2");  // GPT-2's printable form of byte 0xE2
  ASSERT_TRUE(byte_e2.has_value());
  EXPECT_EQ(t->Decode(Ids{*byte_e2}), "\xEF\xBF\xBD");
  // Ids outside the vocabulary are skipped.
  EXPECT_EQ(t->Decode(Ids{-1, 1 << 30}), "");
}

TEST(TokenizerRealTest, SpecialTokenMetadata) {
  auto llama = LoadReal("llama3_1");
  auto gemma = LoadReal("gemma3");
  auto qwen = LoadReal("qwen3");
  if (!llama || !gemma || !qwen) GTEST_SKIP() << "data/tokenizers missing (run scripts/setup.sh)";
  EXPECT_EQ(llama->bos_id(), 128000);
  EXPECT_EQ(llama->Encode("hi", true).front(), 128000);
  EXPECT_EQ(llama->Encode("hi", false).front(), llama->Encode("hi", true)[1]);
  EXPECT_EQ(gemma->bos_id(), 2);
  EXPECT_EQ(gemma->Encode("hi", true).front(), 2);
  EXPECT_FALSE(qwen->bos_id().has_value());
  EXPECT_EQ(qwen->Encode("hi", true), qwen->Encode("hi", false));
  EXPECT_EQ(qwen->TokenToId("<|im_end|>"), qwen->eos_id());
  EXPECT_TRUE(qwen->IsSpecial(*qwen->TokenToId("<|im_start|>")));
  EXPECT_FALSE(qwen->IsSpecial(*qwen->TokenToId("<think>")));
  EXPECT_EQ(qwen->vocab_size(), 151669);
  EXPECT_EQ(gemma->vocab_size(), 262145);
}

TEST(TokenizerRealTest, HarmonyMarkersAreSingleSpecialIds) {
  // GPT-OSS's o200k_harmony: the chat format's markers are one special id
  // each, wherever they occur, and "<|return|>" ends generation.
  auto t = LoadReal("gptoss");
  if (!t) GTEST_SKIP() << "data/tokenizers/gptoss missing (run scripts/setup.sh)";
  const std::pair<const char*, int32_t> markers[] = {
      {"<|start|>", 200006},    {"<|channel|>", 200005}, {"<|message|>", 200008},
      {"<|end|>", 200007},      {"<|return|>", 200002},  {"<|call|>", 200012},
      {"<|constrain|>", 200003}};
  for (const auto& [text, id] : markers) {
    EXPECT_EQ(t->Encode(text, false), Ids{id}) << text;
    EXPECT_EQ(t->TokenToId(text), id) << text;
    EXPECT_TRUE(t->IsSpecial(id)) << text;
  }
  EXPECT_EQ(t->eos_id(), 200002);
  // No BOS is added: the post-processor is ByteLevel only.
  EXPECT_EQ(t->Encode("hi", true), t->Encode("hi", false));
  const Ids ids = t->Encode(
      "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>", false);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), 200006);
  EXPECT_EQ(ids.back(), 200012);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 200005), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 200008), 1);
  // A near miss is ordinary text.
  EXPECT_GT(t->Encode("<|start |>", false).size(), 1u);
  EXPECT_EQ(t->Decode(t->Encode("HELLO'S world'S", false)), "HELLO'S world'S");
}

TEST(TokenizerRealTest, HarmonyPreTokenizerWords) {
  // o200k's pattern: case-insensitive contractions stay on their word,
  // upper-then-lower letter runs split where the case changes back, digits
  // go in threes, marks join letters.
  std::ifstream in(kData / "tokenizers" / "gptoss" / "tokenizer.json");
  if (!in) GTEST_SKIP() << "data/tokenizers/gptoss missing (run scripts/setup.sh)";
  nlohmann::json j = nlohmann::json::parse(in);
  auto pre = PreTokenizer::Build(j.at("pre_tokenizer"));
  ASSERT_TRUE(pre.ok()) << pre.status().ToString();
  auto words = [&](std::string_view text) {
    std::deque<std::string> arena;
    std::vector<std::string_view> out;
    EXPECT_TRUE((*pre)->Run(text, 0, &arena, &out).ok());
    return std::vector<std::string>(out.begin(), out.end());
  };
  using W = std::vector<std::string>;
  EXPECT_EQ(words("IT'S don'T We'LL"), (W{"IT'S", " don'T", " We'LL"}));
  EXPECT_EQ(words("xyzABC 1234567"), (W{"xyz", "ABC", " ", "123", "456", "7"}));
  EXPECT_EQ(words("e\xCC\x81t\xC3\xA9"), (W{"e\xCC\x81t\xC3\xA9"}));
  EXPECT_EQ(words("a\n\n b"), (W{"a", "\n\n", " b"}));
}

TEST(TokenizerRealTest, TokenBytesConcatenateToTheEncodedText) {
  // Byte-level (Llama 3, Qwen3, DeepSeek V3) and byte-fallback (Gemma 3)
  // tokenizers: the exact bytes of Encode's ids give back the text, special
  // tokens and characters split across ids included.
  const std::string texts[] = {
      "<|im_start|>user\nCaf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 x=1;  \n\t"
      "end<|im_end|>\n",
      "<start_of_turn>user\nHello  world \xE2\x82\xAC 12345<end_of_turn>\n",
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n\xCE\xB1\xCE\xB2 ok<|eot_id|>",
      "<|start|>assistant<|channel|>analysis<|message|>\xC7\x85"
      "a IT'S<|end|>"};
  for (const char* name : {"qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss"}) {
    auto t = LoadReal(name);
    if (!t) GTEST_SKIP() << "data/tokenizers missing (run scripts/setup.sh)";
    for (const std::string& text : texts) {
      std::string bytes;
      for (int32_t id : t->Encode(text, false)) {
        auto b = t->TokenBytes(id);
        ASSERT_TRUE(b.has_value()) << name << " id " << id;
        bytes += *b;
      }
      EXPECT_EQ(bytes, text) << name;
    }
    EXPECT_FALSE(t->TokenBytes(-1).has_value()) << name;
    EXPECT_FALSE(t->TokenBytes(t->vocab_size()).has_value()) << name;
  }
  auto qwen = LoadReal("qwen3");
  // One byte of a character: the raw byte, where Decode gives U+FFFD.
  auto byte_e2 = qwen->TokenToId("\xC3\xA2");
  ASSERT_TRUE(byte_e2.has_value());
  EXPECT_EQ(qwen->TokenBytes(*byte_e2), std::string("\xE2"));
  EXPECT_EQ(qwen->TokenBytes(*qwen->TokenToId("<|im_end|>")), "<|im_end|>");
  auto gemma = LoadReal("gemma3");
  auto byte_fallback = gemma->TokenToId("<0xE2>");
  ASSERT_TRUE(byte_fallback.has_value());
  EXPECT_EQ(gemma->TokenBytes(*byte_fallback), std::string("\xE2"));
  EXPECT_EQ(gemma->TokenBytes(*gemma->TokenToId("\xE2\x96\x81the")), " the");
  // Added tokens, special or not.
  EXPECT_TRUE(qwen->IsAdded(*qwen->TokenToId("<|im_start|>")));
  EXPECT_TRUE(qwen->IsAdded(*qwen->TokenToId("<think>")));
  EXPECT_FALSE(qwen->IsAdded(qwen->Encode("hello", false).front()));
  EXPECT_FALSE(qwen->IsAdded(-1));
}

TEST(TokenizerDecodeTest, TokenBytesUnknownWherePositionMatters) {
  // Metaspace strips a space at the sequence start only: no per-token bytes.
  auto meta = MustLoad(TinyJson(
      "[]", "",
      R"({"type": "Metaspace", "replacement": "X", "prepend_scheme": "always", "add_prefix_space": true})",
      "[]", R"({"type": "Metaspace", "replacement": "X", "add_prefix_space": true})"));
  EXPECT_FALSE(meta->TokenBytes(1).has_value());
  // No decoder: tokens are joined with spaces.
  auto plain = MustLoad(TinyJson("[]", "", "null", "[]", "null"));
  EXPECT_FALSE(plain->TokenBytes(1).has_value());
}

TEST(TokenizerRealTest, ConcurrentEncodeMatchesSerial) {
  auto t = LoadReal("llama3_1");
  if (!t) GTEST_SKIP() << "data/tokenizers/llama3_1 missing (run scripts/setup.sh)";
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("item " + std::to_string(i * 7919) + ": the quick brown fox " +
                    std::string(i % 13, ' ') + "日本語 " + std::to_string(i) + "\n");
  std::vector<Ids> serial;
  for (const auto& s : texts) serial.push_back(t->Encode(s));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (t->Encode(texts[(i + k * 31) % texts.size()]) != serial[(i + k * 31) % texts.size()])
            ++bad[k];
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[k], 0);
}

TEST(TokenizerRegexTest, TranslatesJavaScriptSemantics) {
  auto tr = [](std::string_view p) {
    auto r = TokenizerRegex::TranslateJsPattern(p);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r.value() : std::string();
  };
  EXPECT_EQ(tr(R"(\#a\&\~)"), "#a&~");
  EXPECT_EQ(tr(R"(\d+)"), "[0-9]+");
  EXPECT_EQ(tr(R"(\u00e9)"), "\\x{e9}");
  EXPECT_EQ(tr(R"(\ud83d\ude00)"), "\\x{1f600}");
  EXPECT_NE(tr(R"(\s)").find("feff"), std::string::npos);
  EXPECT_FALSE(TokenizerRegex::TranslateJsPattern(R"([\S])").ok());
  // \s follows JavaScript: U+FEFF is whitespace, U+0085 is not.
  auto re = TokenizerRegex::FromPattern(R"(\s+)");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)
                  ->ForEachMatch("a\xEF\xBB\xBF"
                                 "b\xC2\x85"
                                 "c",
                                 [&](size_t b, size_t e) { m.emplace_back(b, e); })
                  .ok());
  EXPECT_EQ(m, (std::vector<std::pair<size_t, size_t>>{{1, 4}}));
  // Empty matches advance by one code point, as matchAll does.
  auto empty = TokenizerRegex::FromPattern("x*");
  ASSERT_TRUE(empty.ok());
  m.clear();
  ASSERT_TRUE(
      (*empty)->ForEachMatch("\xC3\xA9x", [&](size_t b, size_t e) { m.emplace_back(b, e); }).ok());
  EXPECT_EQ(m, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {2, 3}, {3, 3}}));
}

TEST(TokenizerUnicodeTest, ValidatorAgreesWithWhatwgDecoder) {
  namespace tu = tokenizer_unicode;
  std::mt19937 rng(3);
  const unsigned char interesting[] = {0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0,
                                       0xA0, 0xED, 0x9F, 0xEF, 0xF0, 0x90, 0xF4, 0x8F, 0xF5};
  int valid = 0;
  for (int rep = 0; rep < 20000; ++rep) {
    std::string s;
    for (int k = 0, n = static_cast<int>(rng() % 8); k < n; ++k)
      s.push_back(
          static_cast<char>(rng() % 2 ? interesting[rng() % sizeof interesting] : rng() % 256));
    bool changed = false;
    std::string clean = tu::SanitizeUtf8(s, &changed);
    ASSERT_EQ(tu::IsValidUtf8(s), !changed) << rep;
    ASSERT_TRUE(tu::IsValidUtf8(clean));
    valid += !changed;
  }
  EXPECT_GT(valid, 100);  // the generator reaches both outcomes
  // WHATWG: a truncated sequence is one U+FFFD, a bad lead byte one each.
  EXPECT_EQ(tu::SanitizeUtf8("\xE2\x82"
                             "A"),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(tu::SanitizeUtf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(std::string(tu::JsTrimEnd("a \xEF\xBB\xBF\t")), "a");
  EXPECT_EQ(std::string(tu::JsTrimStart("\xE3\x80\x80 b ")), "b ");
}

std::string RunCli(const std::string& args, int* rc) {
  std::string cmd = std::string(AGENTKV_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  *rc = WEXITSTATUS(status);
  return out;
}

TEST(TokenizeCliTest, TokenizeAndDetokenize) {
  const fs::path dir = kData / "tokenizers" / "llama3_1";
  if (!fs::exists(dir / "tokenizer.json")) GTEST_SKIP() << dir << " missing";
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  auto t = LoadReal("llama3_1");
  auto ids = t->Encode("Hello world");
  std::string want = "[";
  for (size_t i = 0; i < ids.size(); ++i) want += (i ? "," : "") + std::to_string(ids[i]);
  want += "]\n";
  int rc = 0;
  EXPECT_EQ(RunCli("tokenize --model " + dir.string() + " --text 'Hello world'", &rc), want);
  EXPECT_EQ(rc, 0);
  TempDir tmp;
  auto file = tmp.Write("in.txt", "Hello world");
  EXPECT_EQ(RunCli("tokenize --model " + dir.string() + " --file " + file.string(), &rc), want);
  EXPECT_EQ(RunCli("tokenize --no-special --model " + dir.string() + " --text 'Hello world'", &rc),
            "[" + want.substr(8));
  EXPECT_EQ(RunCli("detokenize --model " + dir.string() + " --ids 128000,9906,1917", &rc),
            "<|begin_of_text|>Hello world\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(RunCli("detokenize --skip-special --model " + dir.string() + " --ids 128000,9906", &rc),
            "Hello\n");
  RunCli("detokenize --model " + dir.string() + " --ids 1,x,3", &rc);
  EXPECT_EQ(rc, 2);
  RunCli("detokenize --model " + dir.string() + " --ids 999999999", &rc);
  EXPECT_EQ(rc, 2);
  RunCli("tokenize --model " + dir.string(), &rc);
  EXPECT_EQ(rc, 2);
  std::string out = RunCli("tokenize --model /nonexistent --text hi", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("/nonexistent"), std::string::npos);
}

}  // namespace
}  // namespace agentkv::text
