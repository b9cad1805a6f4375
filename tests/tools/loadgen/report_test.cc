#include "report.h"

#include <gtest/gtest.h>

namespace agentkv::loadgen {
namespace {

TEST(ReportTest, Percentile) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_DOUBLE_EQ(Percentile({3, 1, 2}, 0.5), 2);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 1.0), 4);
  EXPECT_DOUBLE_EQ(Percentile({5}, 0.99), 5);
}

TurnResult Ok(int64_t prompt, int64_t cached, int64_t out, double ttft) {
  TurnResult r;
  r.http_status = 200;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.completion_tokens = out;
  r.ttft_s = ttft;
  r.gaps_s = {0.01, 0.02};
  return r;
}

TEST(ReportTest, SummarizesTurnsErrorsAndCacheShares) {
  TurnResult refused;
  refused.http_status = 429;
  refused.error = "HTTP 429: busy";
  TurnResult dropped;
  dropped.error = "connect: refused";
  const std::vector<TurnResult> t1 = {Ok(100, 0, 10, 0.1), Ok(100, 20, 10, 0.3), refused};
  const std::vector<TurnResult> t2 = {Ok(150, 110, 10, 0.05), Ok(150, 55, 5, 0.05), dropped};
  const TurnSummary s1 = SummarizeTurn(1, t1, nullptr, 2.0, 10);
  EXPECT_EQ(s1.requests, 3);
  EXPECT_EQ(s1.ok, 2);
  EXPECT_EQ(s1.output_tokens, 20);
  EXPECT_DOUBLE_EQ(s1.output_tok_s, 10);
  EXPECT_DOUBLE_EQ(s1.cached_share, 0.1);
  EXPECT_FALSE(s1.cached_of_previous.has_value());
  EXPECT_EQ(s1.errors.at("429"), 1);
  EXPECT_DOUBLE_EQ(s1.ttft_p50_ms, 200);
  const TurnSummary s2 = SummarizeTurn(2, t2, &t1, 1.0, 10);
  EXPECT_EQ(s2.short_replies, 1);
  EXPECT_EQ(s2.errors.at("connection"), 1);
  // (110 + 55) over (100 + 10) * 2 held after turn 1.
  ASSERT_TRUE(s2.cached_of_previous.has_value());
  EXPECT_DOUBLE_EQ(*s2.cached_of_previous, 165.0 / 220.0);
  const TurnSummary all = SummarizeAll({t1, t2}, 4.0, 10);
  EXPECT_EQ(all.requests, 6);
  EXPECT_EQ(all.output_tokens, 35);
  EXPECT_DOUBLE_EQ(all.output_tok_s, 35 / 4.0);
  const std::string table = FormatTable({s1, s2}, all, 20.0);
  EXPECT_NE(table.find("engine alone: 20"), std::string::npos) << table;
  EXPECT_NE(table.find("1 errors (429)"), std::string::npos) << table;
  EXPECT_EQ(ToJson(s2)["errors"]["connection"], 1);
}

TEST(ReportTest, PhasesOfATurnFromItsFirstRequestSent) {
  // Sent at 10.0 s and 10.5 s; first tokens at +0.1 and +0.2; last text
  // at +1.0 and +0.8; last bytes 0.05 and 0.25 after the last text.
  TurnResult a = Ok(100, 0, 10, 0.1);
  a.sent_at_s = 10.0;
  a.last_text_s = 1.0;
  a.end_s = 1.05;
  TurnResult b = Ok(100, 0, 10, 0.2);
  b.sent_at_s = 10.5;
  b.last_text_s = 0.8;
  b.end_s = 1.05;
  TurnResult failed;
  failed.error = "connect: refused";
  failed.sent_at_s = 10.2;
  const TurnSummary s = SummarizeTurn(1, {a, b, failed}, nullptr, 2.0, 10);
  EXPECT_NEAR(s.last_sent_ms, 500, 1e-6);
  EXPECT_NEAR(s.first_token_ms, 100, 1e-6);
  EXPECT_NEAR(s.last_first_token_ms, 700, 1e-6);
  EXPECT_NEAR(s.last_text_ms, 1300, 1e-6);
  EXPECT_NEAR(s.last_byte_ms, 1550, 1e-6);
  EXPECT_NEAR(s.tail_p50_ms, 150, 1e-6);
  EXPECT_NEAR(s.tail_max_ms, 250, 1e-6);
  EXPECT_NEAR(ToJson(s)["phases_ms"]["last_byte"].get<double>(), 1550, 1e-6);
}

TEST(ReportTest, ReadsBenchEngineJson) {
  std::string error;
  const std::string two =
      R"({"levels":[{"concurrency":1,"output_tok_s":900},{"concurrency":64,"output_tok_s":25000}]})";
  EXPECT_EQ(EngineTokPerSecond(two, 64, &error), 25000);
  EXPECT_FALSE(EngineTokPerSecond(two, 8, &error).has_value());
  EXPECT_NE(error.find("concurrency 8"), std::string::npos);
  EXPECT_EQ(EngineTokPerSecond(R"({"levels":[{"concurrency":8,"output_tok_s":5}]})", 64, &error),
            5);
  EXPECT_FALSE(EngineTokPerSecond("nope", 64, &error).has_value());
}

}  // namespace
}  // namespace agentkv::loadgen
