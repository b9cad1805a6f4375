#include "sse_parser.h"

#include <gtest/gtest.h>

namespace agentkv::loadgen {
namespace {

TEST(SseParserTest, SplitsEventsAcrossArbitraryPieces) {
  const std::string stream =
      "data: {\"a\":1}\n\n: keep-alive\n\nevent: message_stop\ndata: {\"b\":2}\r\n\r\n"
      "data: one\ndata: two\n\ndata: [DONE]\n\n";
  // Every split point gives the same events.
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    std::vector<SseEvent> events;
    p.Feed(std::string_view(stream).substr(0, cut), &events);
    p.Feed(std::string_view(stream).substr(cut), &events);
    ASSERT_EQ(events.size(), 4u) << "cut at " << cut;
    EXPECT_EQ(events[0].data, "{\"a\":1}");
    EXPECT_EQ(events[0].event, "");
    EXPECT_EQ(events[1].event, "message_stop");
    EXPECT_EQ(events[1].data, "{\"b\":2}");
    EXPECT_EQ(events[2].data, "one\ntwo");
    EXPECT_EQ(events[3].data, "[DONE]");
  }
}

TEST(SseParserTest, HoldsAnUnfinishedEvent) {
  SseParser p;
  std::vector<SseEvent> events;
  p.Feed("data: x\n", &events);
  EXPECT_TRUE(events.empty());
  p.Feed("\n", &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "x");
}

TEST(SseParserTest, CommentsAloneMakeNoEvent) {
  SseParser p;
  std::vector<SseEvent> events;
  p.Feed(": keep-alive\n\n: again\n\n", &events);
  EXPECT_TRUE(events.empty());
}

}  // namespace
}  // namespace agentkv::loadgen
