#include "workload.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace agentkv::loadgen {
namespace {

using nlohmann::json;

TEST(WorkloadTest, WordsAreDeterministicAndSized) {
  const std::string a = Words(7, 100), b = Words(7, 100), c = Words(8, 100);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(std::count(a.begin(), a.end(), ' '), 99);
  EXPECT_EQ(Words(1, 0), "");
}

TEST(WorkloadTest, ParsesApiNames) {
  EXPECT_EQ(ParseApi("openai"), Api::kOpenAi);
  EXPECT_EQ(ParseApi("anthropic"), Api::kAnthropic);
  EXPECT_EQ(ParseApi("agents"), Api::kAgents);
  EXPECT_FALSE(ParseApi("grpc").has_value());
}

TEST(WorkloadTest, OpenAiTurnSendsTheHistoryAndStreamsWithUsage) {
  WorkloadOptions o;
  o.output_tokens = 7;
  const HttpCall c =
      BuildTurn(o, "s1", "sys", {{"user", "u1"}, {"assistant", "r1"}, {"user", "u2"}});
  EXPECT_EQ(c.path, "/v1/chat/completions");
  const json b = json::parse(c.body);
  EXPECT_EQ(b["messages"].size(), 4u);
  EXPECT_EQ(b["messages"][0]["role"], "system");
  EXPECT_EQ(b["messages"][2]["content"], "r1");
  EXPECT_EQ(b["max_tokens"], 7);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["session_id"], "s1");
  EXPECT_EQ(b["temperature"], 0.0);
  bool has_session_header = false;
  for (const auto& [k, v] : c.headers) has_session_header |= k == "x-session-id" && v == "s1";
  EXPECT_TRUE(has_session_header);
}

TEST(WorkloadTest, AnthropicAndAgentsTurns) {
  WorkloadOptions o;
  o.api = Api::kAnthropic;
  o.temperature = 1.0f;
  o.ignore_eos = false;
  json b = json::parse(BuildTurn(o, "s", "sys", {{"user", "u"}}).body);
  EXPECT_EQ(b["system"], "sys");
  EXPECT_EQ(b["messages"].size(), 1u);
  EXPECT_EQ(b["temperature"], 1.0);
  EXPECT_FALSE(b.contains("ignore_eos"));
  o.api = Api::kAgents;
  const HttpCall c = BuildTurn(o, "s", "sys", {{"user", "u1"}, {"assistant", "r"}, {"user", "u2"}});
  EXPECT_EQ(c.path, "/v1/agents/s/generate");
  b = json::parse(c.body);
  EXPECT_EQ(b["message"], "u2");  // the server keeps the rest
}

SseEvent Data(const std::string& d, const std::string& e = "") { return {e, d}; }

TEST(StreamReaderTest, OpenAiStream) {
  StreamReader r(Api::kOpenAi);
  TurnResult t;
  r.OnEvent(Data(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})"), 0.1, &t);
  r.OnEvent(Data(R"({"choices":[{"delta":{"content":"He"}}]})"), 0.2, &t);
  r.OnEvent(Data(R"({"choices":[{"delta":{"content":"llo"}}]})"), 0.25, &t);
  r.OnEvent(Data(R"({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,)"
                 R"("prompt_tokens_details":{"cached_tokens":4}}})"),
            0.3, &t);
  r.OnEvent(Data("[DONE]"), 0.3, &t);
  r.Finish(&t);
  EXPECT_TRUE(t.ok()) << t.error;
  EXPECT_EQ(t.text, "Hello");
  EXPECT_DOUBLE_EQ(t.ttft_s, 0.2);
  ASSERT_EQ(t.gaps_s.size(), 1u);
  EXPECT_NEAR(t.gaps_s[0], 0.05, 1e-12);
  EXPECT_EQ(t.prompt_tokens, 10);
  EXPECT_EQ(t.cached_tokens, 4);
  EXPECT_EQ(t.completion_tokens, 2);
}

TEST(StreamReaderTest, OpenAiStreamWithoutDoneOrUsageFails) {
  StreamReader r(Api::kOpenAi);
  TurnResult t;
  r.OnEvent(Data(R"({"choices":[{"delta":{"content":"x"}}]})"), 0.1, &t);
  r.Finish(&t);
  EXPECT_FALSE(t.ok());
  StreamReader r2(Api::kOpenAi);
  TurnResult t2;
  r2.OnEvent(Data("[DONE]"), 0.1, &t2);
  r2.Finish(&t2);
  EXPECT_EQ(t2.error, "the stream carried no usage");
}

TEST(StreamReaderTest, InStreamErrorIsReported) {
  StreamReader r(Api::kOpenAi);
  TurnResult t;
  r.OnEvent(Data(R"({"error":{"message":"pool too small","type":"server_error"}})"), 0.1, &t);
  r.OnEvent(Data("[DONE]"), 0.1, &t);
  r.Finish(&t);
  EXPECT_EQ(t.error, "stream error: pool too small");
  StreamReader bad(Api::kOpenAi);
  TurnResult u;
  bad.OnEvent(Data("{not json"), 0.1, &u);
  EXPECT_FALSE(u.ok());
}

TEST(StreamReaderTest, AnthropicStream) {
  StreamReader r(Api::kAnthropic);
  TurnResult t;
  r.OnEvent(
      Data(R"({"type":"message_start","message":{"usage":{"input_tokens":10}}})", "message_start"),
      0.1, &t);
  r.OnEvent(
      Data(R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}})",
           "content_block_delta"),
      0.2, &t);
  r.OnEvent(Data(R"({"type":"message_delta","delta":{"stop_reason":"max_tokens"},)"
                 R"("usage":{"input_tokens":6,"output_tokens":1,"cache_read_input_tokens":4}})",
                 "message_delta"),
            0.3, &t);
  r.OnEvent(Data(R"({"type":"message_stop"})", "message_stop"), 0.3, &t);
  r.Finish(&t);
  EXPECT_TRUE(t.ok()) << t.error;
  EXPECT_EQ(t.text, "a");
  EXPECT_EQ(t.prompt_tokens, 10);
  EXPECT_EQ(t.cached_tokens, 4);
  EXPECT_EQ(t.completion_tokens, 1);
}

TEST(StreamReaderTest, AgentsStream) {
  StreamReader r(Api::kAgents);
  TurnResult t;
  r.OnEvent(Data(R"({"text":"ab"})"), 0.1, &t);
  r.OnEvent(Data(R"({"agent_id":"s","text":"ab","usage":{"prompt_tokens":9,)"
                 R"("completion_tokens":2,"cached_tokens":3}})"),
            0.2, &t);
  r.Finish(&t);
  EXPECT_TRUE(t.ok()) << t.error;
  EXPECT_EQ(t.text, "ab");  // the last event's full text is not added again
  EXPECT_EQ(t.prompt_tokens, 9);
  EXPECT_EQ(t.cached_tokens, 3);
}

}  // namespace
}  // namespace agentkv::loadgen
