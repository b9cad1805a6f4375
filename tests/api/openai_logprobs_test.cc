// The OpenAI logprobs shapes and the request fields for logprobs and n,
// with the Qwen3 tokenizer (byte-level BPE: a CJK character spans tokens).
#include "api/openai_logprobs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>

#include "api/generation_job.h"

namespace agentkv::api {
namespace {

using nlohmann::json;

std::unique_ptr<text::Tokenizer> Qwen3() {
  const auto path = std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers/qwen3/tokenizer.json";
  if (!std::filesystem::exists(path)) return nullptr;
  auto t = text::Tokenizer::Load(path);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(OpenAiLogprobsTest, ParsesTheRequestFields) {
  EXPECT_EQ(*ParseChoiceCount(json::object()), 1);
  EXPECT_EQ(*ParseChoiceCount(json{{"n", nullptr}}), 1);
  EXPECT_EQ(*ParseChoiceCount(json{{"n", 16}}), 16);
  for (const json& bad : {json(0), json(17), json(-1), json("2"), json(1.5)})
    EXPECT_FALSE(ParseChoiceCount(json{{"n", bad}}).ok()) << bad;

  EXPECT_FALSE(ParseLogprobs(json::object(), true)->has_value());
  EXPECT_FALSE(ParseLogprobs(json{{"logprobs", false}}, true)->has_value());
  EXPECT_EQ(**ParseLogprobs(json{{"logprobs", true}}, true), 0);
  EXPECT_EQ(**ParseLogprobs(json{{"logprobs", true}, {"top_logprobs", 20}}, true), 20);
  EXPECT_FALSE(ParseLogprobs(json{{"logprobs", true}, {"top_logprobs", 21}}, true).ok());
  EXPECT_FALSE(ParseLogprobs(json{{"top_logprobs", 2}}, true).ok());  // without logprobs
  EXPECT_FALSE(ParseLogprobs(json{{"logprobs", 3}}, true).ok());      // chat: a boolean
  EXPECT_EQ(**ParseLogprobs(json{{"logprobs", 3}}, false), 3);
  EXPECT_FALSE(ParseLogprobs(json{{"logprobs", nullptr}}, false)->has_value());
  EXPECT_FALSE(ParseLogprobs(json{{"logprobs", true}}, false).ok());  // completions: a count
  EXPECT_FALSE(ParseLogprobs(json{{"logprobs", 21}}, false).ok());
}

// Choice 0 keeps the seed; the others get distinct ones, the same each run.
TEST(OpenAiLogprobsTest, ChoiceSeeds) {
  EXPECT_EQ(GenerationJob::ChoiceSeed(42, 0), 42u);
  EXPECT_EQ(GenerationJob::ChoiceSeed(42, 1), GenerationJob::ChoiceSeed(42, 1));
  EXPECT_NE(GenerationJob::ChoiceSeed(42, 1), GenerationJob::ChoiceSeed(42, 2));
  EXPECT_NE(GenerationJob::ChoiceSeed(42, 1), 42u);
  EXPECT_NE(GenerationJob::ChoiceSeed(42, 1), GenerationJob::ChoiceSeed(43, 1));
}

TEST(OpenAiLogprobsTest, ChatEntriesHaveTokenBytesAndTop) {
  auto t = Qwen3();
  if (!t) GTEST_SKIP() << "data/tokenizers/qwen3 missing (run scripts/setup.sh)";
  const std::vector<int32_t> ids = t->Encode(" hello", false);
  ASSERT_EQ(ids.size(), 1u);
  OpenAiLogprobs lp(t.get(), /*chat=*/true);
  std::vector<engine::OutputLogprobs> v(1);
  v[0].logprob = -0.5f;
  v[0].top = {{ids[0], -0.5f}, {ids[0] + 1, -1.25f}};
  const json e = lp.Entries(ids, v);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["token"], " hello");
  EXPECT_EQ(e[0]["logprob"], -0.5);
  EXPECT_EQ(e[0]["bytes"], json::array({32, 104, 101, 108, 108, 111}));
  ASSERT_EQ(e[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(e[0]["top_logprobs"][1]["logprob"], -1.25);
  EXPECT_EQ(e[0]["top_logprobs"][1]["token"], lp.TokenString(ids[0] + 1));
  json all;
  lp.Append(e, &all);
  lp.Append(e, &all);
  const json wrapped = lp.Wrap(all);
  EXPECT_EQ(wrapped["content"].size(), 2u);
  EXPECT_TRUE(wrapped["refusal"].is_null());
  EXPECT_EQ(lp.Wrap(nullptr)["content"], json::array());
}

// JSON has no -inf: a token with no probability reads -9999.0 (OpenAI's
// value), in the chat and the completions shapes.
TEST(OpenAiLogprobsTest, NoProbabilityIsMinus9999NotNull) {
  auto t = Qwen3();
  if (!t) GTEST_SKIP() << "data/tokenizers/qwen3 missing (run scripts/setup.sh)";
  const std::vector<int32_t> ids = t->Encode(" hello", false);
  std::vector<engine::OutputLogprobs> v(1);
  v[0].logprob = -std::numeric_limits<float>::infinity();
  v[0].top = {{ids[0] + 1, -0.1f}, {ids[0] + 2, -std::numeric_limits<float>::infinity()}};
  OpenAiLogprobs chat(t.get(), /*chat=*/true);
  const json e = chat.Entries(ids, v);
  EXPECT_EQ(e[0]["logprob"], -9999.0);
  EXPECT_EQ(e[0]["top_logprobs"][1]["logprob"], -9999.0);
  OpenAiLogprobs completions(t.get(), /*chat=*/false);
  const json c = completions.Entries(ids, v);
  EXPECT_EQ(c["token_logprobs"][0], -9999.0);
  EXPECT_EQ(c["top_logprobs"][0][" hello"], -9999.0);
}

// A token holding part of a UTF-8 character: U+FFFD in the string, the
// exact bytes in `bytes`.
TEST(OpenAiLogprobsTest, PartialCharactersKeepTheirBytes) {
  auto t = Qwen3();
  if (!t) GTEST_SKIP() << "data/tokenizers/qwen3 missing (run scripts/setup.sh)";
  const std::string text = "\xF0\xA0\x9C\x8E";  // a rare CJK character: three tokens
  const std::vector<int32_t> ids = t->Encode(text, false);
  ASSERT_GE(ids.size(), 2u);
  OpenAiLogprobs lp(t.get(), true);
  std::string joined;
  for (int32_t id : ids) joined += lp.TokenBytes(id);
  EXPECT_EQ(joined, text);
  EXPECT_NE(lp.TokenString(ids[0]).find("\xEF\xBF\xBD"), std::string::npos);
}

TEST(OpenAiLogprobsTest, CompletionsEntriesHoldTheSampledTokenAndOffsets) {
  auto t = Qwen3();
  if (!t) GTEST_SKIP() << "data/tokenizers/qwen3 missing (run scripts/setup.sh)";
  const std::vector<int32_t> ids = t->Encode("Hi there", false);
  ASSERT_EQ(ids.size(), 2u);
  OpenAiLogprobs lp(t.get(), /*chat=*/false);
  std::vector<engine::OutputLogprobs> v(2);
  v[0] = {-2.0f, {{ids[1], -0.1f}}};  // the sampled token is not in its top
  v[1] = {-0.3f, {{ids[1], -0.3f}}};
  json all;
  lp.Append(lp.Entries(std::span<const int32_t>(ids).subspan(0, 1),
                       std::span<const engine::OutputLogprobs>(v).subspan(0, 1)),
            &all);
  lp.Append(lp.Entries(std::span<const int32_t>(ids).subspan(1, 1),
                       std::span<const engine::OutputLogprobs>(v).subspan(1, 1)),
            &all);
  EXPECT_EQ(all["tokens"], json::array({"Hi", " there"}));
  EXPECT_EQ(all["token_logprobs"], json::array({-2.0, -0.30000001192092896}));
  EXPECT_EQ(all["text_offset"], json::array({0, 2}));  // code points, across calls
  ASSERT_EQ(all["top_logprobs"][0].size(), 2u);        // the top one plus the sampled
  EXPECT_EQ(all["top_logprobs"][0]["Hi"], -2.0);
  EXPECT_EQ(all["top_logprobs"][1].size(), 1u);
}

}  // namespace
}  // namespace agentkv::api
