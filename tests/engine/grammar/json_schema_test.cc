#include "engine/grammar/json_schema.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/grammar/grammar_matcher.h"

namespace agentkv::grammar {
namespace {

using nlohmann::json;

std::shared_ptr<const TokenVocabulary> ByteVocab() {
  std::vector<std::string> t(256);
  for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = std::string(1, static_cast<char>(i));
  return TokenVocabulary::FromTokens(t);
}

std::shared_ptr<const Grammar> Compile(const std::string& schema) {
  auto g = CompileJsonSchema(nlohmann::ordered_json::parse(schema), ByteVocab());
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : nullptr;
}

// Whole-text match: every byte allowed and the end accepting.
bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.AdvanceBytes(text).ok() && m.accepting();
}

struct Case {
  std::string schema;
  std::vector<std::string> accept, reject;
};

void Check(const Case& c) {
  auto g = Compile(c.schema);
  ASSERT_NE(g, nullptr);
  for (const auto& a : c.accept) EXPECT_TRUE(Matches(g, a)) << c.schema << " should accept " << a;
  for (const auto& r : c.reject) EXPECT_FALSE(Matches(g, r)) << c.schema << " should reject " << r;
}

TEST(JsonSchemaTest, Literals) {
  Check({R"({"type":"null"})", {"null"}, {"nul", "true", " null", "null "}});
  Check({R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}});
  Check({R"({"enum":["a",1,null,{"x":[true]}]})",
         {R"("a")", "1", "null", R"({"x":[true]})"},
         {R"("b")", "2", R"({"x": [true]})"}});
  Check({R"({"const":"k\"q"})", {R"("k\"q")"}, {R"("kq")"}});
  Check({R"({"type":"string","enum":["a",2]})", {R"("a")"}, {"2"}});
}

TEST(JsonSchemaTest, Strings) {
  Check({R"({"type":"string"})",
         {R"("")", R"("héllo")", R"("a\"b\\c\n\u00e9")", "\"\xF0\x9F\x98\x80\""},
         {R"("a)", "\"a\x01\"", R"("\x")", R"("\ud800")", "\"\xC3\"", "\"\xED\xA0\x80\""}});
  Check({R"({"type":"string","minLength":2,"maxLength":3})",
         {R"("ab")", R"("abc")", R"("é\n")"},
         {R"("a")", R"("abcd")", R"("")"}});
  Check({R"({"type":"string","minLength":1})", {R"("a")", R"("abcdefghijkl")"}, {R"("")"}});
}

TEST(JsonSchemaTest, Patterns) {
  Check({R"({"type":"string","pattern":"^[a-z]+-\\d{2,3}$"})",
         {R"("ab-12")", R"("z-999")"},
         {R"("ab-1")", R"("AB-12")", R"("ab-1234")", R"("xab-12 ")"}});
  Check({R"j({"type":"string","pattern":"^(cat|dog)s?$"})j",
         {R"("cat")", R"("dogs")"},
         {R"("cats!")", R"("bird")"}});
  // Unanchored: anything around a match.
  Check({R"({"type":"string","pattern":"ab"})", {R"("ab")", R"("xxaby")"}, {R"("a b")"}});
  // Quotes and backslashes inside the text are written escaped.
  Check({R"({"type":"string","pattern":"^[\"\\\\]x.$"})",
         {R"("\"xa")", R"("\\xé")"},
         {R"("\"x\n")", R"(""xa")"}});
  Check({R"({"type":"string","pattern":"^[^a-c]{2}$"})", {R"("dé")", R"("zz")"}, {R"("ab")"}});
}

TEST(JsonSchemaTest, Integers) {
  Check({R"({"type":"integer"})", {"0", "-7", "123456789"}, {"01", "-0", "1.5", "+1", "1e3"}});
  Check({R"({"type":"integer","minimum":-12,"maximum":305})",
         {"-12", "-1", "0", "9", "10", "99", "100", "299", "305"},
         {"-13", "306", "310", "1000", "-100"}});
  Check(
      {R"({"type":"integer","exclusiveMinimum":5,"exclusiveMaximum":8})", {"6", "7"}, {"5", "8"}});
  Check({R"({"type":"integer","minimum":100})", {"100", "9999999999"}, {"99", "-1"}});
  Check({R"({"type":"integer","maximum":-20})", {"-20", "-21", "-123456"}, {"-19", "0", "5"}});
}

TEST(JsonSchemaTest, Numbers) {
  Check({R"({"type":"number"})",
         {"0", "-1.5", "3.25e-7", "1E+9", "10"},
         {"1.", ".5", "01", "1e", "--1"}});
  Check({R"({"type":"number","minimum":-2,"maximum":3})",
         {"-2", "-2.0", "-1.999", "-0.5", "0", "2.75", "3", "3.000"},
         {"-2.5", "-3", "3.01", "4", "1e0"}});
  Check({R"({"type":"number","minimum":0})", {"0", "0.5", "12345.6"}, {"-0.5", "-1"}});
}

TEST(JsonSchemaTest, Objects) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"string","maxLength":2},"c":{"type":"boolean"}},
      "required":["b"],"additionalProperties":false})";
  Check({s,
         {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"a":1,"b":"","c":true})",
          R"({"b":"x","c":false})", "{ \"a\": 1,\n  \"b\": \"x\" }"},
         {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","d":1})", R"({"a":1,,"b":"x"})",
          R"({"b":"xyz"})"}});
  // All optional: the empty object and any subset in order.
  Check({R"({"properties":{"x":{"type":"null"},"y":{"type":"null"}}})",
         {"{}", R"({"y":null})", R"({"x":null,"y":null})"},
         {R"({,"y":null})", R"({"x":null,})"}});
  Check({R"({"type":"object"})", {"{}", R"({"k":[1,{"z":null}],"j":"s"})"}, {"[]", R"({"k"})"}});
  Check({R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"k":1})"}});
}

TEST(JsonSchemaTest, Arrays) {
  Check({R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
         {"[1]", "[1,2,3]", "[ 1, 2 ]"},
         {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"}});
  Check({R"({"type":"array","items":{"type":"boolean"}})",
         {"[]", "[true]", "[true,false,true,true,false]"},
         {"[true false]"}});
  Check({R"({"type":"array","minItems":2})", {"[1,\"a\"]", "[null,{},[]]"}, {"[1]"}});
}

TEST(JsonSchemaTest, AnyOfAndRefs) {
  Check({R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})",
         {"12", R"("a")"},
         {R"("ab")", "true"}});
  Check({R"({"type":["string","null"]})", {"null", R"("x")"}, {"1"}});
  const std::string tree = R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})";
  Check({tree,
         {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"},
         {R"({"kids":[]})", R"({"v":1,"kids":[{}]})"}});
  // Recursion deeper than the stack bound is cut off.
  std::string deep = "{\"v\":1";
  for (int i = 0; i < 60; ++i) deep += ",\"kids\":[{\"v\":1";
  for (int i = 0; i < 60; ++i) deep += "}]";
  deep += "}";
  EXPECT_FALSE(Matches(Compile(tree), deep));
  Check({R"({"definitions":{"a":{"type":"boolean"}},"properties":{"x":{"$ref":"#/definitions/a"}},
           "required":["x"],"additionalProperties":false})",
         {R"({"x":true})"},
         {R"({"x":1})"}});
}

TEST(JsonSchemaTest, JsonObject) {
  auto g = CompileAnyJsonObject(ByteVocab());
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, R"({"a":[1,2.5e3,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(Matches(*g, "[1]"));
  EXPECT_FALSE(Matches(*g, R"("s")"));
}

TEST(JsonSchemaTest, ToolCalls) {
  std::vector<ToolGrammarSpec> tools = {
      {"get",
       nlohmann::ordered_json::parse(R"({"type":"object","properties":{"x":{"$ref":"#/$defs/n"}},
           "required":["x"],"additionalProperties":false,"$defs":{"n":{"type":"integer"}}})"),
       true},
      {"free", nlohmann::ordered_json::parse(R"({"type":"object"})"), false}};
  const std::string get =
      "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  ToolGrammarOptions o;
  auto g = CompileToolCallGrammar(tools, o, ByteVocab());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(Matches(*g, get));
  EXPECT_TRUE(
      Matches(*g, "<tool_call>\n{\"name\":\"free\",\"arguments\":{\"k\":[1]}}\n</tool_call>"));
  EXPECT_FALSE(
      Matches(*g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"x\": \"1\"}}\n</tool_call>"));
  EXPECT_FALSE(Matches(*g, "<tool_call>\n{\"name\": \"put\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Matches(*g, "hello"));
  // Reasoning first when the prompt ends inside <think>.
  o.starts_in_reasoning = true;
  g = CompileToolCallGrammar(tools, o, ByteVocab());
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, "I should call get.</think>\n\n" + get));
  EXPECT_FALSE(Matches(*g, "I should call get." + get));
  // Not required: text, with calls anywhere, but no unconstrained call.
  o.starts_in_reasoning = false;
  o.required = false;
  g = CompileToolCallGrammar(tools, o, ByteVocab());
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, "just text <tool_ca"));
  EXPECT_TRUE(Matches(*g, "a " + get + " b " + get));
  EXPECT_FALSE(Matches(*g, "a <tool_call>\n{\"name\": \"get\"}\n</tool_call>"));
  // Llama 3.1 JSON: "parameters".
  o.syntax = ToolCallSyntax::kLlama31Json;
  o.required = true;
  g = CompileToolCallGrammar(tools, o, ByteVocab());
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, "{\"name\": \"get\", \"parameters\": {\"x\": 2}}"));
  o.required = false;
  EXPECT_FALSE(CompileToolCallGrammar(tools, o, ByteVocab()).ok());
  // Errors name the tool.
  tools[0].parameters = nlohmann::ordered_json::parse(R"({"type":"object","not":{}})");
  o.syntax = ToolCallSyntax::kHermes;
  auto bad = CompileToolCallGrammar(tools, o, ByteVocab());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tool \"get\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("\"not\""), std::string::npos);
}

std::string ErrorOf(const std::string& schema) {
  auto g = CompileJsonSchema(nlohmann::ordered_json::parse(schema), ByteVocab());
  return g.ok() ? "" : g.status().message();
}

TEST(JsonSchemaTest, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(ErrorOf(R"({"type":"string","format":"uri"})").find("\"format\""), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"oneOf":[{"type":"null"}]})").find("\"oneOf\""), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"number","multipleOf":2})").find("\"multipleOf\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"additionalProperties":{"type":"string"}})").find("additionalProperties"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"array","items":[{"type":"null"}]})").find("\"items\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"$ref":"http://x/y"})").find("$ref"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"$ref":"#/$defs/missing"})").find("$ref"), std::string::npos);
  EXPECT_NE(ErrorOf(R"j({"type":"string","pattern":"(?=a)"})j").find("pattern"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"string","pattern":"(a"})").find("pattern"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"string","pattern":"\\1"})").find("pattern"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"number","minimum":0.5})").find("minimum"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"number","exclusiveMinimum":0})").find("exclusiveMinimum"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"integer","minimum":5,"maximum":4})").find("minimum"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"string","maxLength":100000})").find("maxLength"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"required":["x"],"properties":{}})").find("required"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"type":"tuple"})").find("type"), std::string::npos);
  EXPECT_NE(ErrorOf("false").find("false"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"enum":[]})").find("enum"), std::string::npos);
}

TEST(JsonSchemaTest, BoundsOnSize) {
  // Nesting.
  std::string s = R"({"type":"string"})";
  for (int i = 0; i < 40; ++i) s = R"({"type":"array","items":)" + s + "}";
  EXPECT_NE(ErrorOf(s).find("deeper"), std::string::npos);
  // The node limit.
  GrammarLimits small;
  small.max_nodes = 200;
  auto g =
      CompileJsonSchema(json::parse(R"({"type":"string","maxLength":500})"), ByteVocab(), small);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("grammar states"), std::string::npos);
  // Long epsilon chains (nested optional groups) neither overflow the
  // stack nor run away: the closure is iterative and bounded.
  std::string chain = "^";
  for (int i = 0; i < 50; ++i) chain += "(a?){1000}";
  auto c = CompileJsonSchema(json{{"type", "string"}, {"pattern", chain + "$"}}, ByteVocab());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  GrammarMatcher cm(*c);
  EXPECT_TRUE(cm.AdvanceBytes("\"aaaa").ok());
  // The pattern length.
  json p = {{"type", "string"}, {"pattern", std::string(2000, 'a')}};
  EXPECT_NE(ErrorOf(p.dump()).find("pattern"), std::string::npos);
}

}  // namespace
}  // namespace agentkv::grammar
