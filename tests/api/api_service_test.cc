// ApiService on the default (random-weight) model, called directly: API key
// checks, error shapes, request conversion (count_tokens), and whole and
// streamed generations driven through the AsyncBody interface.
#include "api/api_service.h"

#include "drive_reply.h"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

using nlohmann::json;

class ApiServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = std::string(AGENTKV_DATA_DIR) + "/models/default";
    if (!std::filesystem::exists(dir + "/config.json")) return;
    ServedModelOptions o;
    o.model_dir = dir;
    o.backend.threads = 1;
    o.max_batch = 4;
    auto m = ServedModel::Load(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    host_ = new ModelHost(o, std::move(m).value());
    agents_ = new agent::AgentManager(nullptr);
    metrics_ = new Metrics();
    ctx_ = {host_, agents_, metrics_};
  }
  static void TearDownTestSuite() {
    delete host_;
    delete agents_;
    delete metrics_;
    host_ = nullptr;
  }
  void SetUp() override {
    if (!host_) GTEST_SKIP() << "default model missing (run setup)";
  }

  static HttpRequest Post(const std::string& path, const std::string& body) {
    HttpRequest r;
    r.method = "POST";
    r.path = path;
    r.body = body;
    r.headers["content-type"] = "application/json";
    return r;
  }

  // Runs a reply to the end; returns {status, body}.
  static std::pair<int, std::string> Drive(Reply reply) {
    return testing::DriveReply(std::move(reply));
  }

  static ModelHost* host_;
  static agent::AgentManager* agents_;
  static Metrics* metrics_;
  static ApiContext ctx_;
};

ModelHost* ApiServiceTest::host_ = nullptr;
agent::AgentManager* ApiServiceTest::agents_ = nullptr;
Metrics* ApiServiceTest::metrics_ = nullptr;
ApiContext ApiServiceTest::ctx_;

TEST_F(ApiServiceTest, ApiKeyIsCheckedInEachProtocolsShape) {
  ApiServiceOptions keyed;
  keyed.api_key = "secret";
  ApiService svc(ctx_, keyed);
  HttpRequest health;
  health.method = "GET";
  health.path = "/health";
  EXPECT_EQ(Drive(svc.Handle(health)).first, 200);  // no key needed

  auto [st, body] = Drive(svc.Handle(Post("/v1/chat/completions", "{}")));
  EXPECT_EQ(st, 401);
  EXPECT_TRUE(json::parse(body)["error"].contains("message"));
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", "{}")));
  EXPECT_EQ(st, 401);
  EXPECT_EQ(json::parse(body)["type"], "error");
  EXPECT_EQ(json::parse(body)["error"]["type"], "authentication_error");

  HttpRequest ok =
      Post("/v1/messages/count_tokens", R"({"messages":[{"role":"user","content":"hi"}]})");
  ok.headers["x-api-key"] = "secret";
  EXPECT_EQ(Drive(svc.Handle(ok)).first, 200);
  ok.headers.erase("x-api-key");
  ok.headers["authorization"] = "Bearer secret";
  EXPECT_EQ(Drive(svc.Handle(ok)).first, 200);
}

TEST_F(ApiServiceTest, BadInputIs400) {
  ApiService svc(ctx_, {});
  const char* bad[] = {
      R"({"messages":"hi"})",
      R"({"messages":[{"content":"no role"}]})",
      R"({"messages":[{"role":"user","content":"hi"}],"temperature":"hot"})",
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":-1})",
      R"({"messages":[{"role":"user","content":"hi"}],"stop":[1],"stop_sequences":[1]})",
      R"({"messages":[{"role":"user","content":"hi"}],"stream":"yes"})",
      R"({"messages":[{"role":"user","content":"hi"}],"priority":"urgent"})",
      R"([1,2])",
      R"({"messages":[{"role":"user","content":"hi"})",
  };
  for (const char* b : bad) {
    auto [st, body] = Drive(svc.Handle(Post("/v1/chat/completions", b)));
    EXPECT_EQ(st, 400) << b << " -> " << body;
    EXPECT_EQ(json::parse(body)["error"]["type"], "invalid_request_error") << b;
    std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", b)));
    EXPECT_EQ(st, 400) << b << " -> " << body;
    EXPECT_EQ(json::parse(body)["error"]["type"], "invalid_request_error") << b;
  }
  // OpenAI's reasoning_effort is a template variable: a string.
  EXPECT_EQ(Drive(svc.Handle(Post("/v1/chat/completions",
                                  R"({"messages":[{"role":"user","content":"x"}],)"
                                  R"("reasoning_effort":5,"max_tokens":1})")))
                .first,
            400);
  EXPECT_EQ(Drive(svc.Handle(Post("/v1/chat/completions",
                                  R"({"messages":[{"role":"user","content":"x"}],)"
                                  R"("reasoning_effort":"high","max_tokens":1})")))
                .first,
            200);
  HttpRequest pri = Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
  pri.headers["x-priority"] = "sometimes";
  EXPECT_EQ(Drive(svc.Handle(pri)).first, 400);
  // n: 1..16 choices.
  for (const char* n : {"17", "0", "\"two\"", "1.5"}) {
    EXPECT_EQ(
        Drive(svc.Handle(Post(
                  "/v1/chat/completions",
                  std::string(R"({"messages":[{"role":"user","content":"x"}],"n":)") + n + "}")))
            .first,
        400)
        << n;
  }
  {
    auto [st, body] = Drive(svc.Handle(Post(
        "/v1/chat/completions",
        R"({"messages":[{"role":"user","content":"x"}],"n":2,"max_tokens":2,"ignore_eos":true})")));
    ASSERT_EQ(st, 200) << body;
    const json r = json::parse(body);
    ASSERT_EQ(r["choices"].size(), 2u);
    EXPECT_EQ(r["choices"][1]["index"], 1);
    EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  }
  // A prompt longer than the context.
  std::string huge;
  for (int i = 0; i < 140000; ++i) huge += "word ";
  json too_long = {{"messages", {{{"role", "user"}, {"content", huge}}}}, {"max_tokens", 1}};
  auto [st, body] = Drive(svc.Handle(Post("/v1/chat/completions", too_long.dump())));
  EXPECT_EQ(st, 400) << body;
  EXPECT_NE(json::parse(body)["error"]["message"].get<std::string>().find("context"),
            std::string::npos);
}

TEST_F(ApiServiceTest, DeeplyNestedBodiesAre400BeforeAnyParse) {
  // 100,000 levels in a field of every POST route: printed or copied
  // recursively, this overflowed an io thread's stack and killed the process.
  const std::string deep = std::string(100000, '[') + "1" + std::string(100000, ']');
  const std::string chat = R"({"messages":[{"role":"user","content":"hi"}],"x":)" + deep + "}";
  const std::string agent = R"({"message":"hi","metadata":)" + deep + "}";
  ApiService svc(ctx_, {});
  for (const char* path :
       {"/v1/chat/completions", "/v1/completions", "/v1/batch/chat/completions", "/admin/model"}) {
    auto [st, body] = Drive(svc.Handle(Post(path, chat)));
    EXPECT_EQ(st, 400) << path;
    EXPECT_EQ(json::parse(body)["error"]["type"], "invalid_request_error") << path;
  }
  for (const char* path : {"/v1/messages", "/v1/messages/count_tokens", "/v1/batch/messages"}) {
    auto [st, body] = Drive(svc.Handle(Post(path, chat)));
    EXPECT_EQ(st, 400) << path;
    EXPECT_EQ(json::parse(body)["type"], "error") << path;
    EXPECT_EQ(json::parse(body)["error"]["type"], "invalid_request_error") << path;
  }
  auto [st, body] = Drive(svc.Handle(Post("/v1/agents/a1/generate", agent)));
  EXPECT_EQ(st, 400) << body;

  // The limit is configurable; nesting up to it is accepted (the field is
  // unknown and ignored), one level more is not.
  ApiServiceOptions o;
  o.max_json_depth = 8;
  ApiService narrow(ctx_, o);
  auto nested = [](int depth) {
    return R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"x":)" +
           std::string(static_cast<size_t>(depth - 1), '[') +
           std::string(static_cast<size_t>(depth - 1), ']') + "}";
  };
  EXPECT_EQ(Drive(narrow.Handle(Post("/v1/chat/completions", nested(8)))).first, 200);
  EXPECT_EQ(Drive(narrow.Handle(Post("/v1/chat/completions", nested(9)))).first, 400);
}

TEST_F(ApiServiceTest, BrowserRequestsAreRefusedInEachProtocolsShape) {
  ApiService svc(ctx_, {});
  HttpRequest plain = Post("/v1/messages", R"({"max_tokens":1,"messages":[]})");
  plain.headers["content-type"] = "text/plain";
  auto [st, body] = Drive(svc.Handle(plain));
  EXPECT_EQ(st, 415) << body;
  EXPECT_EQ(json::parse(body)["type"], "error");
  plain.path = "/v1/chat/completions";
  std::tie(st, body) = Drive(svc.Handle(plain));
  EXPECT_EQ(st, 415) << body;
  EXPECT_TRUE(json::parse(body)["error"].is_object());

  HttpRequest page = Post("/v1/messages", R"({"max_tokens":1,"messages":[]})");
  page.headers["origin"] = "https://evil.example";
  std::tie(st, body) = Drive(svc.Handle(page));
  EXPECT_EQ(st, 403) << body;
  EXPECT_EQ(json::parse(body)["error"]["type"], "permission_error");
  HttpRequest rebound;
  rebound.method = "GET";
  rebound.path = "/v1/agents";
  rebound.headers["host"] = "rebind.evil.example:8080";
  EXPECT_EQ(Drive(svc.Handle(rebound)).first, 403);
  rebound.headers["host"] = "127.0.0.1:8080";
  EXPECT_EQ(Drive(svc.Handle(rebound)).first, 200);
}

TEST_F(ApiServiceTest, StopListsAreBounded) {
  ApiService svc(ctx_, {});
  auto with_stops = [](const json& stops, const char* key) {
    return json{
        {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {key, stops}}
        .dump();
  };
  // A million stop strings cost 16 ms a token for the whole batch: refused.
  json million = json::array();
  for (int i = 0; i < 1000000; ++i) million.push_back(std::to_string(i));
  auto [st, body] = Drive(svc.Handle(Post("/v1/chat/completions", with_stops(million, "stop"))));
  EXPECT_EQ(st, 400) << body;
  EXPECT_NE(body.find("at most 64"), std::string::npos) << body;
  std::tie(st, body) =
      Drive(svc.Handle(Post("/v1/messages", with_stops(million, "stop_sequences"))));
  EXPECT_EQ(st, 400) << body;
  EXPECT_EQ(json::parse(body)["error"]["type"], "invalid_request_error");
  // One over-long string.
  std::tie(st, body) = Drive(svc.Handle(
      Post("/v1/chat/completions", with_stops(json::array({std::string(513, 'z')}), "stop"))));
  EXPECT_EQ(st, 400) << body;
  // 64 strings, duplicates among them, are fine.
  json dup = json::array();
  for (int i = 0; i < 64; ++i) dup.push_back(i % 2 ? "alpha" : "beta");
  EXPECT_EQ(Drive(svc.Handle(Post("/v1/chat/completions", with_stops(dup, "stop")))).first, 200);
}

TEST_F(ApiServiceTest, AnthropicConversionCountsTokens) {
  ApiService svc(ctx_, {});
  auto count = [&](const json& body) {
    auto [st, out] = Drive(svc.Handle(Post("/v1/messages/count_tokens", body.dump())));
    EXPECT_EQ(st, 200) << out;
    return json::parse(out)["input_tokens"].get<int>();
  };
  const json user = {{"role", "user"}, {"content", "What is the weather?"}};
  const int plain = count({{"messages", {user}}});
  EXPECT_GT(plain, 0);
  // System as a string, as blocks, or as a role "system" entry: same prompt.
  const int sys_str = count({{"system", "Be brief."}, {"messages", {user}}});
  const int sys_blocks =
      count({{"system", {{{"type", "text"}, {"text", "Be brief."}}}}, {"messages", {user}}});
  const int sys_role =
      count({{"messages", {{{"role", "system"}, {"content", "Be brief."}}, user}}});
  EXPECT_GT(sys_str, plain);
  EXPECT_EQ(sys_str, sys_blocks);
  EXPECT_EQ(sys_str, sys_role);
  // Without `thinking` the Qwen3 template closes an empty think block.
  const int thinking =
      count({{"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}}, {"messages", {user}}});
  EXPECT_LT(thinking, plain);
  // Tools and a tool_use / tool_result round trip make the prompt longer.
  const json tools = json::parse(R"([{"name": "get_weather", "description": "Weather for a city",
      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])");
  const int with_tools = count({{"tools", tools}, {"messages", {user}}});
  EXPECT_GT(with_tools, plain);
  const json convo = {
      user,
      {{"role", "assistant"},
       {"content",
        {{{"type", "text"}, {"text", "Let me check."}},
         {{"type", "tool_use"},
          {"id", "toolu_1"},
          {"name", "get_weather"},
          {"input", {{"city", "Paris"}}}}}}},
      {{"role", "user"},
       {"content",
        {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "Sunny, 21 C"}}}}}};
  EXPECT_GT(count({{"tools", tools}, {"messages", convo}}), with_tools);
}

TEST_F(ApiServiceTest, AnthropicThinkingBudgetIsANonNegativeInteger) {
  ApiService svc(ctx_, {});
  for (const char* budget : {"-5", "\"many\""}) {
    auto [st, body] = Drive(svc.Handle(Post(
        "/v1/messages",
        std::string(R"({"model":"m","max_tokens":4,"thinking":{"type":"enabled",)") +
            R"("budget_tokens":)" + budget + R"(},"messages":[{"role":"user","content":"hi"}]})")));
    EXPECT_EQ(st, 400) << budget << ": " << body;
    EXPECT_NE(body.find("budget_tokens"), std::string::npos) << body;
  }
  // Ignored while thinking is off, as Anthropic's API does.
  auto [st, body] = Drive(svc.Handle(Post(
      "/v1/messages",
      R"({"model":"m","max_tokens":2,"temperature":0,"thinking":{"type":"disabled","budget_tokens":-5},"messages":[{"role":"user","content":"hi"}]})")));
  EXPECT_EQ(st, 200) << body;
}

TEST_F(ApiServiceTest, GenerationsHaveUsageAndFinishReasons) {
  ApiService svc(ctx_, {});
  auto [st, body] = Drive(svc.Handle(Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3,"temperature":0,"stop":["\n\n\n"]})")));
  ASSERT_EQ(st, 200) << body;
  json j = json::parse(body);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 3);
  EXPECT_TRUE(j["choices"][0]["finish_reason"] == "length" ||
              j["choices"][0]["finish_reason"] == "stop");

  // Claude Code asks for 32000 tokens; it is clamped to the context left.
  std::tie(st, body) = Drive(svc.Handle(Post(
      "/v1/messages",
      R"({"model":"claude-sonnet-4","max_tokens":32000,"temperature":0,"stop_sequences":["e"],"thinking":{"type":"enabled","budget_tokens":1024},"context_management":{},"messages":[{"role":"user","content":"hi"}]})")));
  ASSERT_EQ(st, 200) << body;
  j = json::parse(body);
  EXPECT_EQ(j["model"], "claude-sonnet-4");
  EXPECT_TRUE(j["usage"].contains("cache_read_input_tokens"));

  // Repeating a long prompt hits the prefix cache.
  std::string sys;
  for (int i = 0; i < 40; ++i)
    sys += "You are a careful assistant number " + std::to_string(i) + ". ";
  json req = {{"system", sys},
              {"max_tokens", 2},
              {"temperature", 0},
              {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  Drive(svc.Handle(Post("/v1/messages", req.dump())));
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", req.dump())));
  j = json::parse(body);
  EXPECT_GT(j["usage"]["cache_read_input_tokens"].get<int>(), 0) << body;

  // Streamed completions end with [DONE].
  std::tie(st, body) = Drive(
      svc.Handle(Post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":2,"stream":true})")));
  EXPECT_NE(body.find("\"text_completion\""), std::string::npos) << body;
  EXPECT_EQ(body.substr(body.size() - 14), "data: [DONE]\n\n");
}

TEST_F(ApiServiceTest, AnthropicStopSequenceIsReported) {
  ApiService svc(ctx_, {});
  json req = {{"model", "m"},
              {"max_tokens", 12},
              {"temperature", 0},
              {"messages", {{{"role", "user"}, {"content", "Count to ten."}}}}};
  auto [st, body] = Drive(svc.Handle(Post("/v1/messages", req.dump())));
  ASSERT_EQ(st, 200) << body;
  json j = json::parse(body);
  std::string text;
  for (const auto& b : j["content"]) {
    if (b["type"] == "text") text += b["text"].get<std::string>();
  }
  // Greedy decoding repeats itself: a piece of the output (an ASCII
  // character after the first, so it is valid UTF-8) is a stop sequence.
  std::string stop;
  for (size_t i = 1; i < text.size() && stop.empty(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c > 0x20 && c < 0x7f) stop = text.substr(i, 1);
  }
  if (stop.empty()) GTEST_SKIP() << "no ASCII in the greedy output: " << body;
  req["stop_sequences"] = {"\u0001never", stop};
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", req.dump())));
  ASSERT_EQ(st, 200) << body;
  j = json::parse(body);
  EXPECT_EQ(j["stop_reason"], "stop_sequence") << body;
  EXPECT_EQ(j["stop_sequence"], stop) << body;
  // Streamed: message_delta carries them.
  req["stream"] = true;
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", req.dump())));
  const size_t at = body.find("event: message_delta");
  ASSERT_NE(at, std::string::npos) << body;
  const size_t data = body.find("data: ", at) + 6;
  json delta = json::parse(body.substr(data, body.find('\n', data) - data));
  EXPECT_EQ(delta["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(delta["delta"]["stop_sequence"], stop);
  // Without a stop sequence in the output: end_turn or max_tokens, null.
  req["stream"] = false;
  req["stop_sequences"] = {"\u0001never"};
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", req.dump())));
  j = json::parse(body);
  EXPECT_NE(j["stop_reason"], "stop_sequence");
  EXPECT_TRUE(j["stop_sequence"].is_null());
}

// Structured outputs through each protocol: the reply follows the schema,
// and an unsupported keyword is a 400 in the protocol's shape naming it.
TEST_F(ApiServiceTest, StructuredOutputsInEachProtocol) {
  ApiService svc(ctx_, {});
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"n", {{"type", "integer"}, {"minimum", 3}, {"maximum", 7}}},
                         {"ok", {{"type", "boolean"}}}}},
                       {"required", {"n", "ok"}},
                       {"additionalProperties", false}};
  json chat = {{"messages", {{{"role", "user"}, {"content", "JSON please"}}}},
               {"temperature", 1.0},
               {"seed", 3},
               {"max_tokens", 200},
               {"response_format",
                {{"type", "json_schema"}, {"json_schema", {{"name", "r"}, {"schema", schema}}}}}};
  auto [st, body] = Drive(svc.Handle(Post("/v1/chat/completions", chat.dump())));
  ASSERT_EQ(st, 200) << body;
  json j = json::parse(body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  json out = json::parse(j["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_GE(out["n"].get<int>(), 3);
  EXPECT_LE(out["n"].get<int>(), 7);
  EXPECT_TRUE(out["ok"].is_boolean());

  chat["response_format"]["json_schema"]["schema"]["properties"]["n"]["format"] = "int32";
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/chat/completions", chat.dump())));
  EXPECT_EQ(st, 400) << body;
  j = json::parse(body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "response_format");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("\"format\""), std::string::npos);

  // Anthropic: a forced tool gives a tool_use whose input follows input_schema.
  json msg = {{"max_tokens", 200},
              {"temperature", 1.0},
              {"messages", {{{"role", "user"}, {"content", "use the tool"}}}},
              {"tools", {{{"name", "pick"}, {"description", "d"}, {"input_schema", schema}}}},
              {"tool_choice", {{"type", "tool"}, {"name", "pick"}}}};
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", msg.dump())));
  ASSERT_EQ(st, 200) << body;
  j = json::parse(body);
  EXPECT_EQ(j["stop_reason"], "tool_use") << body;
  bool found = false;
  for (const json& block : j["content"]) {
    if (block["type"] != "tool_use") continue;
    found = true;
    EXPECT_EQ(block["name"], "pick");
    EXPECT_GE(block["input"]["n"].get<int>(), 3);
    EXPECT_LE(block["input"]["n"].get<int>(), 7);
  }
  EXPECT_TRUE(found) << body;
  msg["tools"][0]["input_schema"]["properties"]["n"]["multipleOf"] = 2;
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/messages", msg.dump())));
  EXPECT_EQ(st, 400) << body;
  j = json::parse(body);
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("\"multipleOf\""), std::string::npos);

  // The agents API.
  json agent = {
      {"message", "JSON please"},
      {"max_tokens", 200},
      {"temperature", 1.0},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}};
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/agents/structured/generate", agent.dump())));
  ASSERT_EQ(st, 200) << body;
  j = json::parse(body);
  EXPECT_EQ(j["finish_reason"], "stop") << body;
  out = json::parse(j["text"].get<std::string>());
  EXPECT_TRUE(out["ok"].is_boolean());
  agent["response_format"] = {{"type", "xml"}};
  std::tie(st, body) = Drive(svc.Handle(Post("/v1/agents/structured/generate", agent.dump())));
  EXPECT_EQ(st, 400) << body;
}

}  // namespace
}  // namespace agentkv::api
