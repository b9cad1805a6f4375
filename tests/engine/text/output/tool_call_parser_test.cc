#include "engine/text/output/tool_call_parser.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "parser_events.h"

namespace agentkv::text::output {
namespace {

using testing::Events;
using Kind = OutputEvent::Kind;

ToolCallParserOptions Opts(ToolCallFormat f, bool stream = true) {
  ToolCallParserOptions o;
  o.format = f;
  o.stream_arguments = stream;
  return o;
}

Events Run(const ToolCallParserOptions& o, const std::vector<std::string>& pieces,
           int32_t* calls = nullptr) {
  return testing::RunParser<ToolCallParser>(o, pieces, calls);
}

using testing::Describe;

// All at once and byte by byte must agree; returns the events.
Events RunBoth(const ToolCallParserOptions& o, const std::string& text, int32_t* calls = nullptr) {
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  Events whole = Run(o, {text}, calls);
  EXPECT_EQ(Describe(Run(o, bytes)), Describe(whole)) << text;
  EXPECT_EQ(Run(o, bytes), whole) << text;
  return whole;
}

TEST(ToolCallParserTest, HermesCallsBetweenText) {
  int32_t calls = 0;
  Events e = RunBoth(Opts(ToolCallFormat::kHermes),
                     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                     "{\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n"
                     "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
                     &calls);
  EXPECT_EQ(
      Describe(e),
      "T(Let me check.)B0(get_weather)A({\"city\": \"Paris\", \"days\": [1, 2]})EB1(now)A({})E");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(e[1].id.rfind("call_", 0), 0u);
  EXPECT_EQ(e[1].id.size(), 5u + 24u);
  EXPECT_NE(e[1].id, e[4].id);
}

TEST(ToolCallParserTest, ArgumentsStreamBeforeTheCallCloses) {
  ToolCallParser p(Opts(ToolCallFormat::kHermes));
  Events out;
  p.Feed("<tool_call>{\"name\": \"write\", \"arguments\": {\"path\": \"a.txt\", \"text\": \"hel",
         &out);
  EXPECT_EQ(Describe(out), "B0(write)A({\"path\": \"a.txt\", \"text\": \"hel)");
  p.Feed("lo }\"}}</tool_call> done", &out);
  p.Finish(&out);
  EXPECT_EQ(Describe(out), "B0(write)A({\"path\": \"a.txt\", \"text\": \"hello }\"})ET(done)");
}

TEST(ToolCallParserTest, BufferedModeSendsACallOnlyWhenComplete) {
  ToolCallParser p(Opts(ToolCallFormat::kHermes, /*stream=*/false));
  Events out;
  p.Feed("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1", &out);
  EXPECT_TRUE(out.empty());
  p.Feed("}}</tool_call>", &out);
  EXPECT_EQ(Describe(out), "B0(f)A({\"a\": 1})E");
}

TEST(ToolCallParserTest, NameAfterArgumentsAndStringArguments) {
  EXPECT_EQ(
      Describe(RunBoth(Opts(ToolCallFormat::kHermes),
                       "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"s\"}</tool_call>")),
      "B0(s)A({\"q\": 1})E");
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kHermes),
                             "<tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"q\\\": 2}\"}"
                             "</tool_call>")),
            "B0(s)A({\"q\": 2})E");
  EXPECT_EQ(
      Describe(RunBoth(Opts(ToolCallFormat::kHermes), "<tool_call>{\"name\": \"s\"}</tool_call>")),
      "B0(s)A({})E");
}

TEST(ToolCallParserTest, MalformedCallsComeBackAsText) {
  const std::vector<std::string> bad = {
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1,}}</tool_call>",
      "<tool_call>{\"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
      "<tool_call>not json at all</tool_call>",
      "<tool_call>[1, 2]</tool_call>",
      "<tool_call>{\"name\": \"f\"",  // cut off
  };
  for (const std::string& b : bad) {
    for (bool stream : {true, false}) {
      int32_t calls = -1;
      Events e = RunBoth(Opts(ToolCallFormat::kHermes, stream), "Before\n" + b + "\nafter", &calls);
      EXPECT_EQ(calls, 0) << b;
      std::string text;
      int begins = 0, aborts = 0;
      for (const OutputEvent& x : e) {
        if (x.kind == Kind::kText) text += x.text;
        begins += x.kind == Kind::kToolCallBegin;
        aborts += x.kind == Kind::kToolCallAbort;
        EXPECT_NE(x.kind, Kind::kToolCallEnd) << b;
      }
      // Streaming may have begun a call before the break; it is aborted.
      EXPECT_EQ(begins, aborts) << b;
      if (!stream) {
        EXPECT_EQ(begins, 0) << b;
      }
      EXPECT_EQ(text, "Before\n" + b + "\nafter") << b;
    }
  }
}

TEST(ToolCallParserTest, BreakAfterBeginIsAborted) {
  const std::string s = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}</tool_call>ok";
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kHermes), s)),
            "B0(f)A({\"a\": tru)XT(<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}"
            "</tool_call>ok)");
  // Buffered: no trace of a call.
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kHermes, false), s)), "T(" + s + ")");
}

TEST(ToolCallParserTest, CloseTagInsideAStringIsContent) {
  EXPECT_EQ(
      Describe(RunBoth(Opts(ToolCallFormat::kHermes),
                       "<tool_call>{\"name\": \"doc\", \"arguments\": {\"t\": \"</tool_call>\"}}"
                       "</tool_call>")),
      "B0(doc)A({\"t\": \"</tool_call>\"})E");
}

TEST(ToolCallParserTest, MissingCloseTagStillCompletesTheCall) {
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kHermes),
                             "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n")),
            "B0(f)A({})E");
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kHermes),
                             "<tool_call>{\"name\": \"f\", \"arguments\": {}} and more")),
            "B0(f)A({})ET(and more)");
}

TEST(ToolCallParserTest, TagPrefixesInTextAreReleased) {
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kHermes), "a <tool b <tool_cal")),
            "T(a <tool b <tool_cal)");
  ToolCallParser p(Opts(ToolCallFormat::kHermes));
  Events out;
  p.Feed("x <tool_", &out);
  EXPECT_EQ(Describe(out), "T(x)");
  p.Feed("box", &out);
  EXPECT_EQ(Describe(out), "T(x <tool_box)");
}

TEST(ToolCallParserTest, Llama31Json) {
  const ToolCallParserOptions o = Opts(ToolCallFormat::kLlama31Json);
  EXPECT_EQ(Describe(RunBoth(o, "{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}")),
            "B0(search)A({\"q\": \"x\"})E");
  EXPECT_EQ(Describe(RunBoth(o,
                             " <|python_tag|>{\"name\": \"a\", \"arguments\": {}}; "
                             "{\"name\": \"b\", \"parameters\": {\"n\": 1}}")),
            "B0(a)A({})EB1(b)A({\"n\": 1})E");
  EXPECT_EQ(Describe(RunBoth(o, "The answer is {\"name\": 1}")), "T(The answer is {\"name\": 1})");
  // JSON without parameters is an answer, not a call.
  EXPECT_EQ(Describe(RunBoth(o, "{\"name\": \"Bob\", \"age\": 3}")),
            "T({\"name\": \"Bob\", \"age\": 3})");
  EXPECT_EQ(Describe(RunBoth(o, "{\"oops\": ")), "T({\"oops\": )");
  EXPECT_EQ(Describe(RunBoth(o, "<|python_tag|>print(1)")), "T(<|python_tag|>print(1))");
  EXPECT_EQ(Describe(RunBoth(o, "<|python")), "T(<|python)");
  EXPECT_EQ(Describe(RunBoth(o, "{\"name\": \"a\", \"parameters\": {}} trailing")),
            "B0(a)A({})ET(trailing)");
}

TEST(ToolCallParserTest, GemmaFenced) {
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kGemmaFenced),
                             "Sure.\n\n```tool_call\n{\"name\": \"f\", \"arguments\": {\"s\": "
                             "\"```\"}}\n```\nDone.")),
            "T(Sure.)B0(f)A({\"s\": \"```\"})ET(Done.)");
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kGemmaFenced), "```python\nx = 1\n```")),
            "T(```python\nx = 1\n```)");
}

TEST(ToolCallParserTest, NoneFormatPassesTextThrough) {
  EXPECT_EQ(Describe(RunBoth(Opts(ToolCallFormat::kNone), "<tool_call>{}</tool_call>\n")),
            "T(<tool_call>{}</tool_call>\n)");
}

}  // namespace
}  // namespace agentkv::text::output
