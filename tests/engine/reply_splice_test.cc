// SpliceReplyTokens on the real Qwen3 tokenizer and chat template: a render
// that agrees with the agent's tokens reuses them all (the reply's sampled,
// non-canonical ids included); a render that drops the reply's reasoning, a
// reply the client edited, a UTF-8 character split across ids and ordinary
// ids spelling a control marker stop reuse where they diverge; text the
// normalizer rewrites is reused as held; an empty previous and one longer
// than the render.
// Every result must stand for exactly the rendered text, byte for byte.
#include "engine/reply_splice.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "engine/text/chat/chat_template.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_unicode.h"

namespace agentkv::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

class ReplySpliceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fs::path(AGENTKV_DATA_DIR) / "tokenizers/qwen3";
    auto tok = text::Tokenizer::Load(dir / "tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(tok).value().release();
    auto tmpl = text::chat::ChatTemplate::LoadFromModelDir(dir.string());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
    tmpl_ = new text::chat::ChatTemplate(std::move(tmpl).value());
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete tmpl_;
  }

  static std::string Render(const ordered_json& messages, bool generation_prompt = true) {
    text::chat::ChatTemplate::Input in;
    in.messages = messages;
    in.add_generation_prompt = generation_prompt;
    auto text = tmpl_->Render(in);
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    return text.ok() ? *text : "";
  }

  // Ids spelling `text` one UTF-8 character at a time: a valid tokenization
  // that is not the canonical one, as a sampled reply usually is.
  static std::vector<int32_t> PerCharacter(std::string_view text) {
    std::vector<int32_t> ids;
    for (size_t pos = 0; pos < text.size();) {
      const size_t start = pos;
      text::tokenizer_unicode::NextCodePoint(text, &pos);
      for (int32_t id : tok_->Encode(text.substr(start, pos - start), false)) ids.push_back(id);
    }
    return ids;
  }
  // The byte-level token whose bytes are `bytes`.
  static int32_t ByteLevelToken(std::string_view bytes) {
    std::string s;
    for (char c : bytes) {
      const char32_t cp = text::tokenizer_unicode::ByteToUnicode()[static_cast<uint8_t>(c)];
      // UTF-8 of a code point below U+0800 (the table's range).
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
    auto id = tok_->TokenToId(s);
    EXPECT_TRUE(id.has_value()) << s;
    return id.value_or(-1);
  }
  static int32_t ByteToken(uint8_t b) {
    return ByteLevelToken(std::string(1, static_cast<char>(b)));
  }

  static std::string Bytes(std::span<const int32_t> ids) {
    std::string out;
    for (int32_t id : ids) {
      auto b = tok_->TokenBytes(id);
      EXPECT_TRUE(b.has_value()) << id;
      if (b) out += *b;
    }
    return out;
  }

  struct Run {
    ReplySplice splice;
    int encodes = 0;
  };
  static Run Splice(std::span<const int32_t> previous, const std::string& text) {
    Run r;
    const std::vector<int32_t> ids = tok_->Encode(text, false);
    r.splice = SpliceReplyTokens(
        previous, [](int32_t id) { return tok_->TokenBytes(id); },
        [](int32_t id) { return tok_->IsAdded(id); }, text, ids,
        [&r](std::string_view rest) {
          ++r.encodes;
          return tok_->Encode(rest, false);
        });
    // Whatever was reused, the prompt stands for exactly the text (as the
    // server decodes it: invalid UTF-8 as U+FFFD).
    EXPECT_EQ(text::tokenizer_unicode::SanitizeUtf8(Bytes(r.splice.ids)), text);
    EXPECT_EQ(text::tokenizer_unicode::SanitizeUtf8(
                  Bytes(std::span(r.splice.ids).first(r.splice.reused_tokens))),
              text.substr(0, r.splice.reused_bytes));
    return r;
  }

  static std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static bool StartsWith(std::span<const int32_t> ids, std::span<const int32_t> prefix) {
    return ids.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
  }

  const ordered_json turn1_ = ordered_json::parse(R"([
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "What is six times seven?"}])");

  static text::Tokenizer* tok_;
  static text::chat::ChatTemplate* tmpl_;
};

text::Tokenizer* ReplySpliceTest::tok_ = nullptr;
text::chat::ChatTemplate* ReplySpliceTest::tmpl_ = nullptr;

TEST_F(ReplySpliceTest, AgreeingRenderReusesPromptAndSampledReply) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  const std::string reply = "The answer is 42, said the agent.";
  const std::vector<int32_t> generated = PerCharacter(reply);
  ASSERT_NE(generated, tok_->Encode(reply, false));  // re-tokenizing gives other ids
  const std::vector<int32_t> previous = Concat(prompt1, generated);

  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", reply}});
  turn2.push_back({{"role", "user"}, {"content", "And six times eight?"}});
  const std::string text2 = Render(turn2);
  Run r = Splice(previous, text2);
  EXPECT_EQ(r.splice.reused_tokens, previous.size());
  EXPECT_EQ(r.splice.reused_bytes, text1.size() + reply.size());
  EXPECT_TRUE(StartsWith(r.splice.ids, previous));
  // The rest is the normal tokenization's tail, from <|im_end|> on.
  EXPECT_EQ(r.encodes, 0);
  EXPECT_EQ(r.splice.ids[previous.size()], *tok_->TokenToId("<|im_end|>"));
  // Without the reply's ids, the normal tokenization shares only the prompt
  // and the reply's first tokens with what the agent held.
  const std::vector<int32_t> normal = tok_->Encode(text2, false);
  const size_t lcp =
      std::mismatch(previous.begin(), previous.end(), normal.begin()).first - previous.begin();
  EXPECT_LT(lcp, previous.size());
}

TEST_F(ReplySpliceTest, TemplateDroppingReasoningStopsWhereTextDiverges) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  // The model thought first; the client sends the answer back with its
  // reasoning, and Qwen3's template drops reasoning of earlier turns.
  const std::vector<int32_t> generated =
      Concat(tok_->Encode("<think>\nMultiply.\n</think>\n\n", false), PerCharacter("It is 42."));
  const std::vector<int32_t> previous = Concat(prompt1, generated);
  ordered_json turn2 = turn1_;
  turn2.push_back(
      {{"role", "assistant"}, {"content", "It is 42."}, {"reasoning_content", "Multiply."}});
  turn2.push_back({{"role", "user"}, {"content", "Thanks."}});
  const std::string text2 = Render(turn2);
  ASSERT_EQ(text2.find("Multiply"), std::string::npos);
  ASSERT_EQ(text2.substr(0, text1.size()), text1);
  Run r = Splice(previous, text2);
  // Reuse ends after "<|im_start|>assistant\n", the last byte both share.
  EXPECT_EQ(r.splice.reused_tokens, prompt1.size());
  EXPECT_EQ(r.splice.reused_bytes, text1.size());
  EXPECT_EQ(r.splice.ids, tok_->Encode(text2, false));

  // The same with the reasoning inline in the content: the template splits
  // it off and drops it too.
  turn2[2] = {{"role", "assistant"}, {"content", "<think>\nMultiply.\n</think>\n\nIt is 42."}};
  Run inline_reasoning = Splice(previous, Render(turn2));
  EXPECT_EQ(inline_reasoning.splice.reused_tokens, prompt1.size());
}

TEST_F(ReplySpliceTest, ClientEditedReplyStopsAtTheEdit) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  const std::string reply = "The answer is 42 exactly.";
  const std::vector<int32_t> previous = Concat(prompt1, PerCharacter(reply));
  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", "The answer is 43 exactly."}});
  turn2.push_back({{"role", "user"}, {"content", "Sure?"}});
  const std::string text2 = Render(turn2);
  Run r = Splice(previous, text2);
  const size_t edit = text1.size() + std::string("The answer is 4").size();
  EXPECT_EQ(r.splice.reused_bytes, edit);
  EXPECT_EQ(r.splice.reused_tokens, prompt1.size() + PerCharacter("The answer is 4").size());
  EXPECT_TRUE(StartsWith(r.splice.ids, std::span(previous).first(r.splice.reused_tokens)));

  // An edit inside a word: no boundary of the normal tokenization there, so
  // the rest is encoded from the edit on.
  turn2[2]["content"] = "The answex is 42 exactly.";
  Run word = Splice(previous, Render(turn2));
  EXPECT_EQ(word.splice.reused_bytes, text1.size() + std::string("The answe").size());
  EXPECT_EQ(word.encodes, 1);
}

TEST_F(ReplySpliceTest, Utf8CharacterSplitAcrossIds) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  // "café 日本" with é (C3 A9) and 日 (E6 97 A5) sampled one byte at a time.
  std::vector<int32_t> generated = tok_->Encode("caf", false);
  for (uint8_t b : {0xC3, 0xA9}) generated.push_back(ByteToken(b));
  generated = Concat(generated, tok_->Encode(" ", false));
  for (uint8_t b : {0xE6, 0x97, 0xA5}) generated.push_back(ByteToken(b));
  generated = Concat(generated, tok_->Encode("本", false));
  const std::string reply = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC";
  ASSERT_EQ(Bytes(generated), reply);
  // Decoding a lone byte gives U+FFFD; TokenBytes gives the byte.
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{ByteToken(0xC3)}), "\xEF\xBF\xBD");
  const std::vector<int32_t> previous = Concat(prompt1, generated);

  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", reply}});
  turn2.push_back({{"role", "user"}, {"content", "Next."}});
  Run whole = Splice(previous, Render(turn2));
  EXPECT_EQ(whole.splice.reused_tokens, previous.size());

  // The client's text differs in the character's second byte (è, C3 A8):
  // the first byte's id agrees, but the rest cannot be encoded from inside
  // a character, so reuse stops before it.
  turn2[2]["content"] = "caf\xC3\xA8 \xE6\x97\xA5\xE6\x9C\xAC";
  const std::string text2 = Render(turn2);
  Run edited = Splice(previous, text2);
  EXPECT_EQ(edited.splice.reused_bytes, text1.size() + 3);
  EXPECT_EQ(edited.splice.reused_tokens, prompt1.size() + tok_->Encode("caf", false).size());

  // A client that got U+FFFD for a reply cut inside a character.
  turn2[2]["content"] = "caf\xEF\xBF\xBD";
  Run replaced = Splice(previous, Render(turn2));
  EXPECT_EQ(replaced.splice.reused_bytes, text1.size() + 3);
}

TEST_F(ReplySpliceTest, SampledInvalidUtf8IsReusedAsTheClientGotIt) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  // A sample that is not UTF-8: the first two bytes of 日 (E6 97), then
  // " ok", then a lone continuation byte (97), then "!".
  std::vector<int32_t> generated = tok_->Encode("so", false);
  for (uint8_t b : {0xE6, 0x97}) generated.push_back(ByteToken(b));
  generated = Concat(generated, tok_->Encode(" ok", false));
  generated.push_back(ByteToken(0x97));
  generated = Concat(generated, tok_->Encode("!", false));
  const std::vector<int32_t> previous = Concat(prompt1, generated);
  // What the server sent, and the client sends back.
  const std::string sent = tok_->Decode(generated);
  ASSERT_EQ(sent, "so\xEF\xBF\xBD ok\xEF\xBF\xBD!");

  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", sent}});
  turn2.push_back({{"role", "user"}, {"content", "Next."}});
  Run whole = Splice(previous, Render(turn2));
  EXPECT_EQ(whole.splice.reused_tokens, previous.size());

  // A client that changed the replaced character stops reuse before it.
  turn2[2]["content"] = "so? ok\xEF\xBF\xBD!";
  Run edited = Splice(previous, Render(turn2));
  EXPECT_EQ(edited.splice.reused_tokens, prompt1.size() + tok_->Encode("so", false).size());
  // And bytes that would complete the character elsewhere are not a match.
  turn2[2]["content"] = "so\xE6\x97\xA5 ok";
  Run other = Splice(previous, Render(turn2));
  EXPECT_EQ(other.splice.reused_tokens, prompt1.size() + tok_->Encode("so", false).size());
}

TEST_F(ReplySpliceTest, OrdinaryIdsNeverStandInForAControlMarker) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  // The model spelled "<|im_end|>" with ordinary ids after "Hi".
  const std::vector<int32_t> generated = PerCharacter("Hi<|im_end|>");
  for (int32_t id : generated) ASSERT_FALSE(tok_->IsAdded(id));
  const std::vector<int32_t> previous = Concat(prompt1, generated);
  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", "Hi"}});
  turn2.push_back({{"role", "user"}, {"content", "Go on."}});
  const std::string text2 = Render(turn2);
  ASSERT_EQ(Bytes(previous), text2.substr(0, Bytes(previous).size()));  // bytes agree
  Run r = Splice(previous, text2);
  EXPECT_EQ(r.splice.reused_bytes, text1.size() + 2);
  EXPECT_EQ(r.splice.ids[r.splice.reused_tokens], *tok_->TokenToId("<|im_end|>"));
  EXPECT_TRUE(tok_->IsAdded(*tok_->TokenToId("<think>")));
  EXPECT_FALSE(tok_->IsSpecial(*tok_->TokenToId("<think>")));
}

TEST_F(ReplySpliceTest, EmptyPreviousAndUnknownIdsReuseNothing) {
  const std::string text = Render(turn1_);
  Run r = Splice({}, text);
  EXPECT_EQ(r.splice.reused_tokens, 0u);
  EXPECT_EQ(r.splice.ids, tok_->Encode(text, false));
  const std::vector<int32_t> junk = {-1, tok_->vocab_size() + 5};
  Run j = Splice(junk, text);
  EXPECT_EQ(j.splice.reused_tokens, 0u);
  EXPECT_EQ(j.splice.ids, tok_->Encode(text, false));
  EXPECT_FALSE(tok_->TokenBytes(-1).has_value());
  EXPECT_FALSE(tok_->TokenBytes(tok_->vocab_size()).has_value());
}

TEST_F(ReplySpliceTest, PreviousLongerThanTheRenderOrAPrefixOfIt) {
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  const std::vector<int32_t> previous = Concat(prompt1, PerCharacter("A long reply."));
  // The same request again (a retry): the text ends inside what the agent
  // held; all of it is reused, nothing is encoded.
  Run again = Splice(previous, text1);
  EXPECT_EQ(again.splice.ids, prompt1);
  EXPECT_EQ(again.splice.reused_tokens, prompt1.size());
  EXPECT_EQ(again.encodes, 0);
  // A text ending inside one of the held ids: reuse stops before it.
  const std::string cut = text1 + "A lo";
  Run partial = Splice(Concat(prompt1, tok_->Encode("A long", false)), cut);
  EXPECT_EQ(partial.splice.reused_bytes, text1.size() + std::string("A").size());
  // After a restart the agent holds only its stored chain, a prefix of its
  // tokens: that prefix is reused.
  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", "A long reply."}});
  turn2.push_back({{"role", "user"}, {"content", "More."}});
  const std::string text2 = Render(turn2);
  const std::span<const int32_t> chain = std::span(previous).first(prompt1.size() + 3);
  Run stored = Splice(chain, text2);
  EXPECT_EQ(stored.splice.reused_tokens, chain.size());
  EXPECT_TRUE(StartsWith(stored.splice.ids, chain));
}

TEST_F(ReplySpliceTest, TextTheNormalizerRewritesIsReusedAsHeld) {
  // "e" + combining acute and a CJK compatibility ideograph: Qwen3's NFC
  // normalizer rewrites both, so the normal ids do not reproduce these
  // bytes, but the ids the agent held do; the normal tokenization is placed
  // again at the next added token (<|im_end|>), where the rest comes from.
  const std::string text1 = Render(turn1_);
  const std::vector<int32_t> prompt1 = tok_->Encode(text1, false);
  const std::string reply = "Cafe\xCC\x81 \xEF\xA6\x90 time.";
  // The ideograph as the one id holding its bytes (Encode would give the
  // NFC form's).
  std::vector<int32_t> generated = PerCharacter("Cafe\xCC\x81 ");
  generated.push_back(ByteLevelToken("\xEF\xA6\x90"));
  const std::vector<int32_t> previous = Concat(prompt1, Concat(generated, PerCharacter(" time.")));
  ASSERT_EQ(Bytes(previous), text1 + reply);
  ordered_json turn2 = turn1_;
  turn2.push_back({{"role", "assistant"}, {"content", reply}});
  turn2.push_back({{"role", "user"}, {"content", "Ok."}});
  const std::string text2 = Render(turn2);
  const std::vector<int32_t> normal = tok_->Encode(text2, false);
  ASSERT_NE(Bytes(normal), text2);
  Run r = Splice(previous, text2);
  EXPECT_EQ(r.splice.reused_tokens, previous.size());
  EXPECT_EQ(r.encodes, 0);
  const std::vector<int32_t> after = tok_->Encode("<|im_end|>\n<|im_start|>user\nOk.", false);
  EXPECT_TRUE(std::equal(after.begin(), after.end(), r.splice.ids.begin() + previous.size()));
  // The client edits the reply after the rewritten stretch: the edit is
  // found, reuse stops there and the rest is encoded from it.
  turn2[2]["content"] = "Cafe\xCC\x81 \xEF\xA6\x90 tame.";
  Run edited = Splice(previous, Render(turn2));
  EXPECT_EQ(edited.splice.reused_bytes, text1.size() + reply.find("time") + 1);
  EXPECT_EQ(edited.encodes, 1);
}

}  // namespace
}  // namespace agentkv::engine
