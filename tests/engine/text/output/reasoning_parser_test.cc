#include "engine/text/output/reasoning_parser.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace agentkv::text::output {
namespace {

using Events = std::vector<OutputEvent>;

Events Run(ReasoningParserOptions o, const std::vector<std::string>& pieces) {
  ReasoningParser p(o);
  Events out;
  for (const std::string& s : pieces) p.Feed(s, &out);
  p.Finish(&out);
  return out;
}

// Byte by byte and all at once must agree.
Events RunBoth(ReasoningParserOptions o, const std::string& text) {
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  Events whole = Run(o, {text});
  EXPECT_EQ(Run(o, bytes), whole) << text;
  return whole;
}

ReasoningParserOptions On(bool starts_in_reasoning = false) {
  ReasoningParserOptions o;
  o.enabled = true;
  o.starts_in_reasoning = starts_in_reasoning;
  return o;
}

TEST(ReasoningParserTest, SplitsThinkBlockFromAnswer) {
  Events e = RunBoth(On(), "<think>\nLet me see.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(e,
            (Events{OutputEvent::Reasoning("Let me see."), OutputEvent::Text("The answer is 4.")}));
}

TEST(ReasoningParserTest, StartsInReasoningWithoutOpenTag) {
  Events e = RunBoth(On(true), "Hmm, 2+2.\n</think>\n\n4");
  EXPECT_EQ(e, (Events{OutputEvent::Reasoning("Hmm, 2+2."), OutputEvent::Text("4")}));
  // The model may still write the open tag; it is skipped.
  EXPECT_EQ(RunBoth(On(true), "<think>x</think>y"),
            (Events{OutputEvent::Reasoning("x"), OutputEvent::Text("y")}));
}

TEST(ReasoningParserTest, NoThinkBlockIsAllAnswer) {
  EXPECT_EQ(RunBoth(On(), "  <thinking> is not the tag"),
            (Events{OutputEvent::Text("  <thinking> is not the tag")}));
  EXPECT_EQ(RunBoth(On(), "a <think>b</think>"), (Events{OutputEvent::Text("a <think>b</think>")}));
  ReasoningParserOptions off;
  EXPECT_EQ(RunBoth(off, "<think>x</think>"), (Events{OutputEvent::Text("<think>x</think>")}));
}

TEST(ReasoningParserTest, UnclosedReasoningAndCutOffTags) {
  EXPECT_EQ(RunBoth(On(), "<think>still going </thi"),
            (Events{OutputEvent::Reasoning("still going </thi")}));
  EXPECT_EQ(RunBoth(On(), "<thi"), (Events{OutputEvent::Text("<thi")}));
  EXPECT_EQ(RunBoth(On(true), "  "), Events{});
}

TEST(ReasoningParserTest, HoldsOnlyWhatMightBeATag) {
  ReasoningParser p(On());
  Events out;
  p.Feed("<think>abc </", &out);
  EXPECT_EQ(out, (Events{OutputEvent::Reasoning("abc")}));  // " " and "</" held
  p.Feed("b>", &out);
  EXPECT_EQ(out, (Events{OutputEvent::Reasoning("abc </b>")}));
}

}  // namespace
}  // namespace agentkv::text::output
