#include "engine/text/output/harmony_parser.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "parser_events.h"

namespace agentkv::text::output {
namespace {

using testing::Events;
using Kind = OutputEvent::Kind;

ToolCallParserOptions Opts(bool tools = true, bool stream = true) {
  ToolCallParserOptions o;
  o.format = tools ? ToolCallFormat::kHarmony : ToolCallFormat::kNone;
  o.stream_arguments = stream;
  return o;
}

Events Run(const ToolCallParserOptions& o, const std::vector<std::string>& pieces,
           int32_t* calls = nullptr) {
  return testing::RunParser<HarmonyParser>(o, pieces, calls);
}

using testing::Describe;

// Whole, split in two at every byte, and byte by byte must all agree.
Events RunAllSplits(const ToolCallParserOptions& o, const std::string& text,
                    int32_t* calls = nullptr) {
  const Events whole = Run(o, {text}, calls);
  for (size_t i = 1; i < text.size(); ++i) {
    const Events split = Run(o, {text.substr(0, i), text.substr(i)});
    if (split != whole) {
      ADD_FAILURE() << "split at " << i << " of \"" << text << "\"\n  whole: " << Describe(whole)
                    << "\n  split: " << Describe(split);
      break;
    }
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  EXPECT_EQ(Describe(Run(o, bytes)), Describe(whole)) << text;
  return whole;
}

TEST(HarmonyParserTest, ParseHeaderReadsRoleChannelRecipientAndType) {
  using H = HarmonyParser::Header;
  EXPECT_EQ(HarmonyParser::ParseHeader("assistant<|channel|>analysis"),
            (H{"assistant", "analysis", "", ""}));
  EXPECT_EQ(HarmonyParser::ParseHeader("<|channel|>final"), (H{"", "final", "", ""}));
  EXPECT_EQ(HarmonyParser::ParseHeader(" to=functions.get_weather<|channel|>commentary json"),
            (H{"", "commentary", "functions.get_weather", "json"}));
  EXPECT_EQ(
      HarmonyParser::ParseHeader("assistant<|channel|>commentary to=functions.f <|constrain|>json"),
      (H{"assistant", "commentary", "functions.f", "json"}));
  EXPECT_EQ(HarmonyParser::ParseHeader("functions.f to=assistant<|channel|>commentary"),
            (H{"functions.f", "commentary", "assistant", ""}));
  EXPECT_EQ(HarmonyParser::ParseHeader(""), (H{}));
}

TEST(HarmonyParserTest, AnalysisThenFinal) {
  int32_t calls = -1;
  Events e = RunAllSplits(Opts(),
                          "<|channel|>analysis<|message|>The user greets. Reply.<|end|>"
                          "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
                          &calls);
  EXPECT_EQ(Describe(e), "R(The user greets. Reply.)T(Hello! How can I help?)");
  EXPECT_EQ(calls, 0);
  // The end marker may be in the text too.
  e = RunAllSplits(Opts(), "<|channel|>final<|message|>Done.<|return|>");
  EXPECT_EQ(Describe(e), "T(Done.)");
}

TEST(HarmonyParserTest, ToolCallWithRecipientBeforeOrAfterTheChannel) {
  int32_t calls = 0;
  Events e = RunAllSplits(Opts(),
                          "<|channel|>analysis<|message|>Need weather.<|end|>"
                          "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                          "<|message|>{\"city\": \"Paris\"}<|call|>",
                          &calls);
  EXPECT_EQ(Describe(e), "R(Need weather.)B0(get_weather)A({\"city\": \"Paris\"})E");
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(e[1].kind, Kind::kToolCallBegin);
  EXPECT_EQ(e[1].id, ToolCallId("call_", 0, 0));
  // As the prompt ends with <|start|>assistant, the recipient may come first;
  // generation stops on <|call|>, which the text then lacks.
  e = RunAllSplits(Opts(),
                   " to=functions.search<|channel|>commentary <|constrain|>json<|message|>"
                   "  {\"q\": [1, {\"a\": \"<|end\"}]}",
                   &calls);
  EXPECT_EQ(Describe(e), "B0(search)A({\"q\": [1, {\"a\": \"<|end\"}]})E");
  EXPECT_EQ(calls, 1);
  e = RunAllSplits(Opts(), "<|channel|>commentary to=functions.now <|constrain|>json<|message|>");
  EXPECT_EQ(Describe(e), "B0(now)A({})E");
  // A recipient outside functions keeps its name.
  e = RunAllSplits(Opts(), "<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}");
  EXPECT_EQ(Describe(e), "B0(browser.search)A({\"query\": \"x\"})E");
}

TEST(HarmonyParserTest, CommentaryPreambleAndSeveralCalls) {
  int32_t calls = 0;
  Events e = RunAllSplits(Opts(),
                          "<|channel|>commentary<|message|>Checking both.<|end|>"
                          "<|start|>assistant to=functions.a<|channel|>commentary json<|message|>"
                          "{}<|call|><|start|>assistant to=functions.b<|channel|>commentary json"
                          "<|message|>{\"x\": 1}<|call|>",
                          &calls);
  EXPECT_EQ(Describe(e), "T(Checking both.)B0(a)A({})EB1(b)A({\"x\": 1})E");
  EXPECT_EQ(calls, 2);
}

TEST(HarmonyParserTest, WithoutStreamingACallComesWhole) {
  Events e = RunAllSplits(Opts(true, /*stream=*/false),
                          " to=functions.f<|channel|>commentary json<|message|>\n{\"a\": 1}");
  EXPECT_EQ(Describe(e), "B0(f)A({\"a\": 1})E");
  e = RunAllSplits(Opts(true, false), " to=functions.f<|channel|>commentary json<|message|>{bad");
  EXPECT_EQ(Describe(e), "T( to=functions.f<|channel|>commentary json<|message|>{bad)");
}

TEST(HarmonyParserTest, BadArgumentsAbortAndKeepTheText) {
  int32_t calls = -1;
  Events e = RunAllSplits(
      Opts(), " to=functions.f<|channel|>commentary json<|message|>{\"a\": oops}<|call|>", &calls);
  EXPECT_EQ(Describe(e),
            "B0(f)A({\"a\": oops})XT( to=functions.f<|channel|>commentary json<|message|>"
            "{\"a\": oops})");
  EXPECT_EQ(calls, 0);
  // Not an object.
  e = RunAllSplits(Opts(), " to=functions.f<|channel|>commentary json<|message|>[1]");
  EXPECT_EQ(Describe(e), "B0(f)A([1])XT( to=functions.f<|channel|>commentary json<|message|>[1])");
  // Cut off mid-arguments.
  e = RunAllSplits(Opts(), " to=functions.f<|channel|>commentary json<|message|>{\"a\": ");
  EXPECT_EQ(Describe(e),
            "B0(f)A({\"a\": )XT( to=functions.f<|channel|>commentary json<|message|>{\"a\": )");
  // A later call still gets the next index.
  e = RunAllSplits(Opts(),
                   " to=functions.f<|channel|>commentary json<|message|>x<|call|>"
                   "<|start|>assistant to=functions.g<|channel|>commentary json<|message|>{}",
                   &calls);
  EXPECT_EQ(Describe(e),
            "B0(f)A(x)XT( to=functions.f<|channel|>commentary json<|message|>x)B1(g)A({})E");
  EXPECT_EQ(calls, 1);
}

TEST(HarmonyParserTest, UnknownOrMissingChannelIsText) {
  Events e = RunAllSplits(Opts(), "<|channel|>notes<|message|>Some text.<|end|>");
  EXPECT_EQ(Describe(e), "T(Some text.)");
  e = RunAllSplits(Opts(), "<|message|>No channel.");
  EXPECT_EQ(Describe(e), "T(No channel.)");
}

TEST(HarmonyParserTest, MissingMessageMarkerKeepsTheHeaderAsText) {
  // An end marker before <|message|>.
  Events e = RunAllSplits(Opts(),
                          "<|channel|>final Hello<|end|><|start|>assistant<|channel|>"
                          "final<|message|>Hi");
  EXPECT_EQ(Describe(e), "T(<|channel|>final HelloHi)");  // adjacent deltas merge
  // A byte no header has: the rest is text.
  e = RunAllSplits(Opts(), "Plain answer, no format at all.\nSecond line.");
  EXPECT_EQ(Describe(e), "T(Plain answer, no format at all.\nSecond line.)");
  // Cut off inside the header.
  e = RunAllSplits(Opts(), "<|channel|>analy");
  EXPECT_EQ(Describe(e), "T(<|channel|>analy)");
  // Too long to be a header.
  const std::string words(HarmonyParser::kMaxHeaderBytes + 10, 'a');
  e = RunAllSplits(Opts(), words + "<|message|>x");
  EXPECT_EQ(Describe(e), "T(" + words + "<|message|>x)");
}

TEST(HarmonyParserTest, ToolMessagesWithToolsOffOrFromAnotherRoleAreRawText) {
  const std::string call = " to=functions.f<|channel|>commentary json<|message|>{\"a\": 1}";
  Events e = RunAllSplits(Opts(/*tools=*/false), call);
  EXPECT_EQ(Describe(e), "T(" + call + ")");
  // The model writing the tool's reply itself.
  e = RunAllSplits(Opts(),
                   "<|channel|>final<|message|>A<|end|><|start|>functions.f to=assistant"
                   "<|channel|>commentary<|message|>{\"fake\": 1}<|end|>");
  EXPECT_EQ(Describe(e),
            "T(Afunctions.f to=assistant<|channel|>commentary<|message|>{\"fake\": 1})");
}

TEST(HarmonyParserTest, LenientAboutFraming) {
  // A new channel without <|end|><|start|>.
  Events e = RunAllSplits(Opts(),
                          "<|channel|>analysis<|message|>think<|channel|>final"
                          "<|message|>answer");
  EXPECT_EQ(Describe(e), "R(think)T(answer)");
  // <|start|> without <|end|>, stray end markers and whitespace between messages.
  e = RunAllSplits(Opts(),
                   "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final"
                   "<|message|>b<|end|><|end|>\n  <|start|>assistant<|channel|>final"
                   "<|message|>c");
  EXPECT_EQ(Describe(e), "R(a)T(bc)");
  // Text between messages is kept.
  e = RunAllSplits(Opts(),
                   "<|channel|>final<|message|>b<|end|>\n stray \n<|start|>assistant"
                   "<|channel|>final<|message|>c");
  EXPECT_EQ(Describe(e), "T(b\n strayc)");
}

TEST(HarmonyParserTest, SpecialCharactersInBodiesAreContent) {
  Events e = RunAllSplits(Opts(), "<|channel|>final<|message|>a < b, x <| y, |> \xE2\x9C\x93");
  EXPECT_EQ(Describe(e), "T(a < b, x <| y, |> \xE2\x9C\x93)");
}

}  // namespace
}  // namespace agentkv::text::output
