#include "engine/sampling_params.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace agentkv::engine {
namespace {

// Applies `mutate` to default params and expects InvalidArgument whose
// message names `field`.
template <typename F>
void ExpectInvalid(F mutate, const std::string& field) {
  SamplingParams p;
  mutate(p);
  Status st = p.Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << field;
  EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
}

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams().Validate().ok()); }

TEST(SamplingParamsTest, AcceptsRangeEdges) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = -1;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 0.01f;
  p.max_tokens = 1;
  p.logprobs = SamplingParams::kMaxLogprobs;
  p.stop = {"\n\n"};
  p.stop_token_ids = {0};
  EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
  EXPECT_TRUE(p.greedy());
  p.temperature = 2.0f;
  p.top_k = 0;
  p.min_p = 0.0f;
  p.logprobs = 0;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
  EXPECT_FALSE(p.greedy());
}

TEST(SamplingParamsTest, RejectsOutOfRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid([](SamplingParams& p) { p.temperature = -0.1f; }, "temperature");
  ExpectInvalid([](SamplingParams& p) { p.temperature = 2.01f; }, "temperature");
  ExpectInvalid([&](SamplingParams& p) { p.temperature = nan; }, "temperature");
  ExpectInvalid([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  ExpectInvalid([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p");
  ExpectInvalid([&](SamplingParams& p) { p.top_p = nan; }, "top_p");
  ExpectInvalid([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  ExpectInvalid([](SamplingParams& p) { p.min_p = -0.01f; }, "min_p");
  ExpectInvalid([](SamplingParams& p) { p.min_p = 1.01f; }, "min_p");
  ExpectInvalid([](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");
  ExpectInvalid([](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty");
  ExpectInvalid([](SamplingParams& p) { p.repetition_penalty = INFINITY; }, "repetition_penalty");
  ExpectInvalid([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty");
  ExpectInvalid([](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty");
  ExpectInvalid([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  ExpectInvalid([](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop strings");
  ExpectInvalid([](SamplingParams& p) { p.stop_token_ids = {5, -1}; }, "stop_token_ids");
  ExpectInvalid([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  ExpectInvalid([](SamplingParams& p) { p.logprobs = -1; }, "logprobs");
  // Stop lists are bounded: 64 strings of 512 bytes, 64 token ids.
  ExpectInvalid([](SamplingParams& p) { p.stop.assign(65, "x"); }, "at most 64 stop strings");
  ExpectInvalid([](SamplingParams& p) { p.stop = {std::string(513, 'a')}; }, "512 bytes");
  ExpectInvalid([](SamplingParams& p) { p.stop_token_ids.assign(65, 3); }, "stop_token_ids");
  SamplingParams edge;
  edge.stop.assign(64, std::string(512, 'b'));
  edge.stop_token_ids.assign(64, 1);
  EXPECT_TRUE(edge.Validate().ok());
}

}  // namespace
}  // namespace agentkv::engine
