// response_format end to end on the CPU with the default random model at
// temperature 1: 50+ schemas, every output validated by an independent
// validator (python3-jsonschema, tests/api/validate_structured.py).
#include "api/response_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/grammar/grammar_matcher.h"
#include "engine/text/output/output_parser.h"

namespace agentkv::api {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::shared_ptr<ServedModel>& Model() {
  static std::shared_ptr<ServedModel> m;
  return m;
}

class ResponseFormatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fs::path(AGENTKV_DATA_DIR) / "models" / "default";
    if (!fs::exists(dir / "config.json")) return;
    ServedModelOptions o;
    o.model_dir = dir.string();
    o.max_batch = 64;
    auto m = ServedModel::Load(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    Model() = std::move(m).value();
  }
  static void TearDownTestSuite() { Model().reset(); }
  void SetUp() override {
    if (!Model()) GTEST_SKIP() << "no data/models/default";
  }
};

Result<std::shared_ptr<const grammar::Grammar>> Parse(const json& body) {
  return ParseResponseFormat(body.dump(), body, *Model(), /*chat=*/true);
}

json SchemaFormat(const json& schema) {
  return {{"response_format",
           {{"type", "json_schema"},
            {"json_schema", {{"name", "t"}, {"schema", schema}, {"strict", true}}}}}};
}

TEST_F(ResponseFormatTest, FormatsAndErrors) {
  auto none = Parse(json::object());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto text = Parse({{"response_format", {{"type", "text"}}}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, nullptr);
  auto obj = Parse({{"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(obj.ok());
  EXPECT_NE(*obj, nullptr);
  auto sch = Parse(SchemaFormat({{"type", "boolean"}}));
  ASSERT_TRUE(sch.ok()) << sch.status().ToString();
  EXPECT_NE(*sch, nullptr);

  auto err = [](const json& body) {
    auto r = Parse(body);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(err({{"response_format", "json"}}).find("response_format"), std::string::npos);
  EXPECT_NE(err({{"response_format", {{"type", "yaml"}}}}).find("type"), std::string::npos);
  EXPECT_NE(err({{"response_format", {{"type", "json_schema"}}}}).find("json_schema"),
            std::string::npos);
  EXPECT_NE(err({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}})
                .find("schema"),
            std::string::npos);
  const std::string kw = err(SchemaFormat({{"type", "string"}, {"format", "email"}}));
  EXPECT_NE(kw.find("\"format\""), std::string::npos) << kw;
  EXPECT_NE(kw.find("response_format.json_schema.schema"), std::string::npos) << kw;
}

TEST_F(ResponseFormatTest, KeepsTheClientsPropertyOrder) {
  // "b" before "a" in the request text: a greedy run writes "b" first.
  const std::string raw =
      R"({"response_format":{"type":"json_schema","json_schema":{"name":"o","schema":
      {"type":"object","properties":{"b":{"type":"boolean"},"a":{"type":"boolean"}},
      "required":["b","a"],"additionalProperties":false}}}})";
  auto g = ParseResponseFormat(raw, json::parse(raw), *Model(), /*chat=*/true);
  ASSERT_TRUE(g.ok());
  engine::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 40;
  p.grammar = *g;
  auto prompt = Model()->tokenizer().Encode("Answer in JSON.", true);
  auto h = Model()->Submit(prompt, p, engine::Priority::kNormal);
  ASSERT_TRUE(h.ok());
  std::string text;
  for (;;) {
    engine::RequestOutput ev = h->stream->Pop();
    text += ev.text;
    if (ev.kind != engine::RequestOutput::Kind::kDelta) break;
  }
  EXPECT_LT(text.find("\"b\""), text.find("\"a\"")) << text;
}

// Schemas with every supported feature. Strings carry a maxLength (or an
// enum / pattern): a random model rarely picks one of the few tokens that
// close an unbounded string.
std::vector<json> Schemas() {
  std::vector<json> s;
  const json str = {{"type", "string"}, {"maxLength", 6}};
  s.push_back({{"type", "boolean"}});
  s.push_back({{"type", "null"}});
  s.push_back({{"type", "integer"}});
  s.push_back({{"type", "number"}});
  s.push_back(str);
  s.push_back({{"type", "string"}, {"minLength", 2}, {"maxLength", 4}});
  s.push_back({{"enum", {"red", "green", "blue", 7, nullptr}}});
  s.push_back({{"const", {{"k", {1, 2}}}}});
  s.push_back({{"type", "string"}, {"pattern", "^[a-z]{2,5}-\\d{3}$"}});
  s.push_back({{"type", "string"}, {"pattern", "^(yes|no|maybe)!?$"}});
  s.push_back({{"type", "string"}, {"pattern", "^[A-F0-9]{4}(:[A-F0-9]{4}){0,2}$"}});
  s.push_back({{"type", "string"}, {"pattern", "^\\w{1,8}@\\w{1,8}\\.(com|org)$"}});
  s.push_back({{"type", "integer"}, {"minimum", -50}, {"maximum", 50}});
  s.push_back({{"type", "integer"}, {"minimum", 1000}, {"maximum", 1000000}});
  s.push_back({{"type", "integer"}, {"exclusiveMinimum", 0}, {"exclusiveMaximum", 10}});
  s.push_back({{"type", "number"}, {"minimum", 0}, {"maximum", 1}});
  s.push_back({{"type", "number"}, {"minimum", -3}, {"maximum", 12}});
  s.push_back({{"type", {"string", "null"}}, {"maxLength", 3}});
  s.push_back({{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 5}});
  s.push_back({{"type", "array"}, {"items", str}, {"minItems", 2}, {"maxItems", 3}});
  s.push_back({{"type", "array"}, {"items", {{"type", "boolean"}}}, {"minItems", 1}});
  s.push_back({{"type", "array"},
               {"items", {{"type", "array"}, {"items", {{"type", "null"}}}, {"maxItems", 2}}},
               {"maxItems", 3}});
  s.push_back({{"anyOf", {{{"type", "integer"}}, str, {{"type", "boolean"}}}}});
  s.push_back(
      {{"anyOf",
        {{{"type", "string"}, {"maxLength", 2}}, {{"type", "string"}, {"pattern", "^x+$"}}}}});
  const json person = {{"type", "object"},
                       {"properties",
                        {{"name", str},
                         {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 130}}},
                         {"email", {{"type", "string"}, {"pattern", "^[a-z]{1,8}@x\\.org$"}}}}},
                       {"required", {"name", "age"}},
                       {"additionalProperties", false}};
  s.push_back(person);
  s.push_back({{"type", "array"}, {"items", person}, {"maxItems", 3}});
  s.push_back({{"type", "object"},
               {"properties", {{"a", str}, {"b", {{"type", "boolean"}}}}},
               {"additionalProperties", false}});
  s.push_back(
      {{"type", "object"}, {"properties", json::object()}, {"additionalProperties", false}});
  s.push_back(
      {{"type", "object"},
       {"properties",
        {{"op", {{"enum", {"add", "sub", "mul"}}}},
         {"args",
          {{"type", "array"}, {"items", {{"type", "number"}}}, {"minItems", 2}, {"maxItems", 2}}}}},
       {"required", {"op", "args"}},
       {"additionalProperties", false}});
  s.push_back({{"type", "object"},
               {"properties",
                {{"status", {{"const", "ok"}}},
                 {"data",
                  {{"anyOf",
                    {{{"type", "null"}},
                     {{"type", "object"},
                      {"properties",
                       {{"id", {{"type", "integer"}}},
                        {"tags", {{"type", "array"}, {"items", str}, {"maxItems", 2}}}}},
                      {"required", {"id"}},
                      {"additionalProperties", false}}}}}}}},
               {"required", {"status", "data"}},
               {"additionalProperties", false}});
  // $ref and recursion.
  s.push_back(
      {{"$defs",
        {{"node",
          {{"type", "object"},
           {"properties",
            {{"v", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}},
             {"kids",
              {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}, {"maxItems", 2}}}}},
           {"required", {"v"}},
           {"additionalProperties", false}}}}},
       {"$ref", "#/$defs/node"}});
  s.push_back(
      {{"definitions", {{"color", {{"enum", {"r", "g", "b"}}}}}},
       {"type", "object"},
       {"properties",
        {{"fg", {{"$ref", "#/definitions/color"}}}, {"bg", {{"$ref", "#/definitions/color"}}}}},
       {"required", {"fg", "bg"}},
       {"additionalProperties", false}});
  s.push_back({{"$defs",
                {{"pt",
                  {{"type", "array"},
                   {"items", {{"type", "integer"}, {"minimum", -9}, {"maximum", 9}}},
                   {"minItems", 2},
                   {"maxItems", 2}}}}},
               {"type", "array"},
               {"items", {{"$ref", "#/$defs/pt"}}},
               {"maxItems", 4}});
  s.push_back(
      {{"type", "object"},
       {"properties",
        {{"tool", {{"const", "read_file"}}},
         {"arguments",
          {{"type", "object"},
           {"properties",
            {{"path",
              {{"type", "string"}, {"pattern", "^/[a-z]{1,8}(/[a-z]{1,8}){0,2}\\.(cc|h|md)$"}}},
             {"offset", {{"type", "integer"}, {"minimum", 0}, {"maximum", 100000}}},
             {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 2000}}}}},
           {"required", {"path"}},
           {"additionalProperties", false}}}}},
       {"required", {"tool", "arguments"}},
       {"additionalProperties", false}});
  // Generated variations: bounds, sizes and nesting depths.
  for (int i = 0; i < 6; ++i)
    s.push_back({{"type", "integer"}, {"minimum", -i * 37}, {"maximum", i * i * 101 + 3}});
  for (int i = 0; i < 5; ++i) {
    json e = json::array();
    for (int k = 0; k <= i; ++k) e.push_back("v" + std::to_string(k * 13));
    s.push_back(
        {{"type", "array"}, {"items", {{"enum", e}}}, {"minItems", i}, {"maxItems", i + 2}});
  }
  for (int d = 1; d <= 5; ++d) {
    json x = {{"type", "boolean"}};
    for (int k = 0; k < d; ++k)
      x = {{"type", "object"},
           {"properties", {{"n" + std::to_string(k), x}, {"s", str}}},
           {"required", {"n" + std::to_string(k)}},
           {"additionalProperties", false}};
    s.push_back(x);
  }
  for (int i = 1; i <= 4; ++i)
    s.push_back({{"type", "string"}, {"minLength", i}, {"maxLength", i * 3}});
  for (int i = 0; i < 4; ++i)
    s.push_back({{"anyOf",
                  {{{"type", "integer"}, {"minimum", i}, {"maximum", i + 5}},
                   {{"type", "array"}, {"items", {{"type", "null"}}}, {"maxItems", i}},
                   {{"enum", {"a" + std::to_string(i), i * 1.5}}}}}});
  return s;
}

bool HaveJsonschema() { return std::system("python3 -c 'import jsonschema' 2>/dev/null") == 0; }

TEST_F(ResponseFormatTest, RandomModelOutputsValidate) {
  if (!HaveJsonschema()) GTEST_SKIP() << "python3-jsonschema is not installed";
  const std::vector<json> schemas = Schemas();
  ASSERT_GE(schemas.size(), 50u);
  json messages = json::array({{{"role", "user"}, {"content", "Reply with JSON."}}});
  auto prompt = Model()->EncodeChat(nlohmann::ordered_json(messages), nullptr);
  ASSERT_TRUE(prompt.ok());
  std::vector<engine::RequestHandle> handles;
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto g = Parse(SchemaFormat(schemas[i]));
    ASSERT_TRUE(g.ok()) << g.status().ToString() << " " << schemas[i].dump();
    engine::SamplingParams p;
    p.temperature = 1.0f;
    p.seed = 1000 + i;
    p.max_tokens = 600;
    p.grammar = *g;
    auto h = Model()->Submit(*prompt, p, engine::Priority::kNormal);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    handles.push_back(*h);
  }
  json cases = json::array();
  for (size_t i = 0; i < handles.size(); ++i) {
    std::string text;
    engine::RequestOutput ev;
    do {
      ev = handles[i].stream->Pop();
      text += ev.text;
    } while (ev.kind == engine::RequestOutput::Kind::kDelta);
    ASSERT_EQ(ev.kind, engine::RequestOutput::Kind::kFinished) << ev.error.ToString();
    EXPECT_EQ(ev.finish, engine::FinishReason::kStop) << schemas[i].dump() << "\n" << text;
    cases.push_back({{"schema", schemas[i]}, {"output", text}});
  }
  const fs::path file =
      fs::temp_directory_path() / ("agentkv_structured_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << cases.dump(1);
  const std::string cmd = std::string("python3 ") + AGENTKV_SOURCE_DIR +
                          "/tests/api/validate_structured.py " + file.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "see the validator's output above";
  fs::remove(file);
}

// Forced tool calls (OpenAI required / named with strict, Anthropic any /
// tool): the output is one call in the model's syntax whose arguments
// validate against the tool's schema.
TEST_F(ResponseFormatTest, ForcedToolCallsFollowTheSchema) {
  if (!HaveJsonschema()) GTEST_SKIP() << "python3-jsonschema is not installed";
  ASSERT_EQ(Model()->model_type(), "qwen3");
  const json read = {{"type", "object"},
                     {"properties",
                      {{"path", {{"type", "string"}, {"pattern", "^/[a-z]{1,6}\\.md$"}}},
                       {"lines", {{"type", "integer"}, {"minimum", 1}, {"maximum", 99}}}}},
                     {"required", {"path", "lines"}},
                     {"additionalProperties", false}};
  const json ask = {{"type", "object"},
                    {"properties", {{"q", {{"enum", {"yes", "no"}}}}}},
                    {"required", {"q"}},
                    {"additionalProperties", false}};
  auto tools = nlohmann::ordered_json::array();
  for (const auto& [name, schema] : {std::pair{"read", read}, std::pair{"ask", ask}})
    tools.push_back({{"type", "function"},
                     {"function", {{"name", name}, {"parameters", schema}, {"strict", true}}}});
  const std::vector<std::pair<ToolProtocol, json>> bodies = {
      {ToolProtocol::kOpenAi, {{"tool_choice", "required"}}},
      {ToolProtocol::kOpenAi,
       {{"tool_choice", {{"type", "function"}, {"function", {{"name", "ask"}}}}}}},
      {ToolProtocol::kAnthropic, {{"tool_choice", {{"type", "any"}}}}},
      {ToolProtocol::kAnthropic, {{"tool_choice", {{"type", "tool"}, {"name", "read"}}}}}};
  auto prompt = Model()->tokenizer().Encode("Call a tool.", true);
  json cases = json::array();
  int seed = 0;
  for (const auto& [protocol, body] : bodies) {
    auto g = ToolCallGrammar(protocol, tools, body, *Model());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_NE(*g, nullptr);
    for (int k = 0; k < 3; ++k) {
      engine::SamplingParams p;
      p.temperature = 1.0f;
      p.seed = seed++;
      p.max_tokens = 300;
      p.grammar = *g;
      auto h = Model()->Submit(prompt, p, engine::Priority::kNormal);
      ASSERT_TRUE(h.ok());
      std::string text;
      engine::RequestOutput ev;
      do {
        ev = h->stream->Pop();
        text += ev.text;
      } while (ev.kind == engine::RequestOutput::Kind::kDelta);
      ASSERT_EQ(ev.finish, engine::FinishReason::kStop) << text;
      const std::string open = "<tool_call>\n", close = "\n</tool_call>";
      ASSERT_EQ(text.rfind(open, 0), 0u) << text;
      ASSERT_EQ(text.substr(text.size() - close.size()), close) << text;
      const json call =
          json::parse(text.substr(open.size(), text.size() - open.size() - close.size()));
      const std::string name = call["name"];
      if (body["tool_choice"].is_object() && body["tool_choice"].contains("function")) {
        EXPECT_EQ(name, "ask");
      }
      if (body["tool_choice"].contains("name")) {
        EXPECT_EQ(name, "read");
      }
      cases.push_back(
          {{"schema", name == "read" ? read : ask}, {"output", call["arguments"].dump()}});
    }
  }
  const fs::path file =
      fs::temp_directory_path() / ("agentkv_tools_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << cases.dump(1);
  const std::string cmd = std::string("python3 ") + AGENTKV_SOURCE_DIR +
                          "/tests/api/validate_structured.py " + file.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "see the validator's output above";
  fs::remove(file);
}

// Qwen3 with thinking on: a structured reply may start with a <think>
// block, which the reasoning budget bounds (thinking_token_budget, else
// half of max_tokens). With the random model at temperature 1 over the
// template's own prompts (thinking on, off, and a block the prompt opened):
// every reply's answer (what the reasoning parser leaves as text) follows
// the schema, the block never takes more than the budget plus the closing
// tag's tokens, a budget of 0 allows no reasoning, and with thinking off
// or no prompt known the grammar is the schema's alone.
TEST_F(ResponseFormatTest, ThinkingBeforeAStructuredReplyStaysWithinTheBudget) {
  ASSERT_EQ(Model()->model_type(), "qwen3");
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"n", {{"type", "integer"}, {"minimum", 3}, {"maximum", 7}}},
                         {"ok", {{"type", "boolean"}}}}},
                       {"required", {"n", "ok"}},
                       {"additionalProperties", false}};
  const json body = SchemaFormat(schema);
  const nlohmann::ordered_json messages =
      nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Think, then reply."}}});
  std::string on_text, off_text;
  ASSERT_TRUE(Model()->EncodeChat(messages, nullptr, {}, true, &on_text).ok());
  ASSERT_TRUE(
      Model()->EncodeChat(messages, nullptr, {{"enable_thinking", false}}, true, &off_text).ok());
  const std::string open_text = on_text + "<think>\n";
  auto grammar_for = [&](const std::string* text) {
    auto g = ParseResponseFormat(body.dump(), body, *Model(), /*chat=*/true, text);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return g.ok() ? *g : nullptr;
  };
  EXPECT_FALSE(grammar_for(&off_text)->has_reasoning()) << "thinking off";
  EXPECT_FALSE(grammar_for(nullptr)->has_reasoning()) << "no prompt known";
  auto completion = ParseResponseFormat(body.dump(), body, *Model(), /*chat=*/false, &on_text);
  ASSERT_TRUE(completion.ok());
  EXPECT_FALSE((*completion)->has_reasoning()) << "a completion's raw text";
  ASSERT_TRUE(grammar_for(&on_text)->has_reasoning());
  ASSERT_TRUE(grammar_for(&open_text)->has_reasoning());

  struct Run {
    const std::string* text;
    bool open;
    std::optional<int32_t> budget;
  };
  const int max_tokens = 80;
  std::vector<Run> runs;
  for (const std::string* t : {static_cast<const std::string*>(&on_text), &open_text})
    for (std::optional<int32_t> b :
         {std::optional<int32_t>(), std::optional<int32_t>(0), std::optional<int32_t>(12)})
      runs.push_back({t, t == &open_text, b});
  runs.push_back({&off_text, false, std::nullopt});
  struct Live {
    size_t run;
    engine::RequestHandle handle;
  };
  std::vector<Live> live;
  int seed = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    auto g = grammar_for(runs[r].text);
    ASSERT_TRUE(g);
    const std::vector<int32_t> prompt = Model()->tokenizer().Encode(*runs[r].text, false);
    for (int k = 0; k < 8; ++k) {
      engine::SamplingParams p;
      p.temperature = 1.0f;
      p.seed = 700 + seed++;
      p.max_tokens = max_tokens;
      p.reasoning_budget = runs[r].budget;
      p.grammar = g;
      auto h = Model()->Submit(prompt, p, engine::Priority::kNormal);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      live.push_back({r, *h});
    }
  }
  int full_blocks = 0, blocks = 0;
  for (const Live& l : live) {
    const Run& run = runs[l.run];
    std::vector<int32_t> tokens;
    std::string text;
    engine::RequestOutput ev;
    do {
      ev = l.handle.stream->Pop();
      tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
      text += ev.text;
    } while (ev.kind == engine::RequestOutput::Kind::kDelta);
    ASSERT_EQ(ev.kind, engine::RequestOutput::Kind::kFinished) << ev.error.ToString();
    EXPECT_EQ(ev.finish, engine::FinishReason::kStop) << text;
    // The tokens up to the end of the closing tag (0: no block).
    std::string bytes;
    size_t through_close = 0;
    for (size_t i = 0; i < tokens.size() && through_close == 0; ++i) {
      bytes += Model()->tokenizer().TokenBytes(tokens[i]).value_or("");
      if (bytes.find("</think>") != std::string::npos) through_close = i + 1;
    }
    const int32_t budget = run.budget.value_or(max_tokens / 2);
    const bool opened = run.open || text.starts_with("<think>");
    if (run.text == &off_text) {
      EXPECT_FALSE(opened) << text;
    }
    if (opened) {
      ++blocks;
      ASSERT_GT(through_close, 0u) << "an open block must close before the answer: " << text;
      EXPECT_LE(through_close, static_cast<size_t>(budget) + 8) << text;
      if (through_close >= static_cast<size_t>(budget)) ++full_blocks;
    }
    if (budget == 0) {
      if (run.open) {
        EXPECT_TRUE(text.starts_with("</think>")) << "no reasoning at all: " << text;
      } else {
        EXPECT_FALSE(opened) << text;
      }
    }
    // The reasoning parser's answer (as the server parses the reply to
    // that prompt) follows the schema.
    const text::output::OutputParserOptions po =
        ServedModel::ParserOptions(Model(), false, *run.text);
    EXPECT_EQ(po.reasoning.starts_in_reasoning, run.open);
    text::output::OutputParser parser(po);
    std::vector<text::output::OutputEvent> events;
    parser.Feed(text, &events);
    parser.Finish(&events);
    std::string answer, reasoning;
    for (const auto& e : events) {
      if (e.kind == text::output::OutputEvent::Kind::kText) answer += e.text;
      if (e.kind == text::output::OutputEvent::Kind::kReasoning) reasoning += e.text;
    }
    EXPECT_EQ(reasoning.find("</think>"), std::string::npos) << text;
    const json out = json::parse(answer, nullptr, false);
    ASSERT_TRUE(out.is_object()) << "answer: " << answer << "\nreply: " << text;
    EXPECT_GE(out["n"].get<int>(), 3);
    EXPECT_LE(out["n"].get<int>(), 7);
    EXPECT_TRUE(out["ok"].is_boolean());
    EXPECT_EQ(out.size(), 2u);
  }
  // Every prompt-opened reply reasons; the random model writes on until
  // its budget closes the block.
  EXPECT_GE(blocks, 24);
  EXPECT_GE(full_blocks, 8);
}

// A required tool call gets the block too (thinking on); `auto`, whose
// reply is free text around the calls, does not, nor does thinking off.
TEST_F(ResponseFormatTest, RequiredToolCallsMayThinkFirst) {
  auto tools = nlohmann::ordered_json::array({{{"type", "function"},
                                               {"function",
                                                {{"name", "ask"},
                                                 {"strict", true},
                                                 {"parameters",
                                                  {{"type", "object"},
                                                   {"properties", {{"q", {{"type", "string"}}}}},
                                                   {"required", {"q"}},
                                                   {"additionalProperties", false}}}}}}});
  const nlohmann::ordered_json messages =
      nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Ask."}}});
  std::string on_text, off_text;
  ASSERT_TRUE(Model()->EncodeChat(messages, tools, {}, true, &on_text).ok());
  ASSERT_TRUE(
      Model()->EncodeChat(messages, tools, {{"enable_thinking", false}}, true, &off_text).ok());
  const json required = {{"tool_choice", "required"}};
  auto g = ToolCallGrammar(ToolProtocol::kOpenAi, tools, required, *Model(), &on_text);
  ASSERT_TRUE(g.ok() && *g);
  EXPECT_TRUE((*g)->has_reasoning());
  grammar::GrammarMatcher m(*g);
  ASSERT_TRUE(m.AdvanceBytes("<think>\nThe user wants a question.\n</think>\n\n<tool_call>\n"
                             "{\"name\": \"ask\", \"arguments\": {\"q\": \"why\"}}\n</tool_call>")
                  .ok());
  EXPECT_TRUE(m.accepting());
  g = ToolCallGrammar(ToolProtocol::kOpenAi, tools, required, *Model(), &off_text);
  ASSERT_TRUE(g.ok() && *g);
  EXPECT_FALSE((*g)->has_reasoning());
  g = ToolCallGrammar(ToolProtocol::kOpenAi, tools, json::object(), *Model(), &on_text);
  ASSERT_TRUE(g.ok() && *g);
  EXPECT_FALSE((*g)->has_reasoning()) << "auto with a strict function";
  g = ToolCallGrammar(ToolProtocol::kAnthropic, tools, {{"tool_choice", {{"type", "any"}}}},
                      *Model(), &on_text);
  ASSERT_TRUE(g.ok() && *g);
  EXPECT_TRUE((*g)->has_reasoning());
}

TEST_F(ResponseFormatTest, ToolConstraintsOnlyWhenAskedAndErrorsNamed) {
  auto tools = nlohmann::ordered_json::array(
      {{{"type", "function"},
        {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}});
  // auto without strict, Anthropic auto: no constraint.
  auto g = ToolCallGrammar(ToolProtocol::kOpenAi, tools, json::object(), *Model());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g, nullptr);
  g = ToolCallGrammar(ToolProtocol::kAnthropic, tools, {{"tool_choice", {{"type", "auto"}}}},
                      *Model());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g, nullptr);
  // auto with a strict function: text and calls.
  tools[0]["function"]["strict"] = true;
  g = ToolCallGrammar(ToolProtocol::kOpenAi, tools, json::object(), *Model());
  ASSERT_TRUE(g.ok());
  EXPECT_NE(*g, nullptr);
  auto err = [&](ToolProtocol p, const json& body) {
    auto r = ToolCallGrammar(p, tools, body, *Model());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(err(ToolProtocol::kAnthropic, {{"tool_choice", {{"type", "tool"}, {"name", "g"}}}})
                .find("tool_choice"),
            std::string::npos);
  EXPECT_NE(err(ToolProtocol::kOpenAi,
                {{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}})
                .find("response_format"),
            std::string::npos);
  tools[0]["function"]["parameters"] = {{"type", "object"}, {"oneOf", json::array()}};
  EXPECT_NE(err(ToolProtocol::kOpenAi, {{"tool_choice", "required"}}).find("\"oneOf\""),
            std::string::npos);
}

TEST_F(ResponseFormatTest, UnconstrainedSequencesInTheBatchAreUnaffected) {
  auto prompt = Model()->tokenizer().Encode("The cache keeps", true);
  engine::SamplingParams plain;
  plain.temperature = 0;
  plain.max_tokens = 24;
  auto run = [&](const engine::SamplingParams& p) {
    auto h = Model()->Submit(prompt, p, engine::Priority::kNormal);
    EXPECT_TRUE(h.ok());
    std::vector<int32_t> tokens;
    engine::RequestOutput ev;
    do {
      ev = h->stream->Pop();
      tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
    } while (ev.kind == engine::RequestOutput::Kind::kDelta);
    return tokens;
  };
  const std::vector<int32_t> alone = run(plain);
  // The same request again, beside constrained ones in the same steps.
  auto g = Parse(SchemaFormat({{"type", "array"}, {"items", {{"type", "integer"}}}}));
  ASSERT_TRUE(g.ok());
  std::vector<engine::RequestHandle> others;
  for (int i = 0; i < 4; ++i) {
    engine::SamplingParams c;
    c.temperature = 1.0f;
    c.seed = i;
    c.max_tokens = 24;
    c.grammar = *g;
    auto h = Model()->Submit(prompt, c, engine::Priority::kNormal);
    ASSERT_TRUE(h.ok());
    others.push_back(*h);
  }
  EXPECT_EQ(run(plain), alone);
  for (auto& h : others) {
    engine::RequestOutput ev;
    do ev = h.stream->Pop();
    while (ev.kind == engine::RequestOutput::Kind::kDelta);
  }
}

}  // namespace
}  // namespace agentkv::api
