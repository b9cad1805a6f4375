// Metrics: Prometheus text exposition of counters, histograms and sampled
// gauges.
#include "api/metrics.h"

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

TEST(MetricsTest, RendersCountersHistogramsAndGauges) {
  Metrics m;
  m.CountRequest("/v1/chat/completions", 200);
  m.CountRequest("/v1/chat/completions", 200);
  m.CountRequest("/v1/messages", 400);
  m.CountTokens(100, 60, 10);
  m.CountTokens(50, 0, 5);
  m.ObserveTtft(0.02);
  m.ObserveTtft(3.0);
  m.ObserveInterToken(0.004);
  const std::string text =
      m.Render({{"agentkv_queue_length", "Waiting", "gauge", {{"", 3}}},
                {"agentkv_kv_blocks", "Blocks", "gauge", {{"state=\"free\"", 7}}}});
  auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("# TYPE agentkv_requests_total counter\n")) << text;
  EXPECT_TRUE(has("agentkv_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"));
  EXPECT_TRUE(has("agentkv_requests_total{endpoint=\"/v1/messages\",status=\"400\"} 1\n"));
  EXPECT_TRUE(has("agentkv_prompt_tokens_total 150\n"));
  EXPECT_TRUE(has("agentkv_cached_prompt_tokens_total 60\n"));
  EXPECT_TRUE(has("agentkv_output_tokens_total 15\n"));
  EXPECT_TRUE(has("agentkv_prefix_cache_hit_rate 0.4\n"));
  // Histogram buckets are cumulative, +Inf equals the count.
  EXPECT_TRUE(has("# TYPE agentkv_time_to_first_token_seconds histogram\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_bucket{le=\"2.5\"} 1\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_sum 3.02\n"));
  EXPECT_TRUE(has("agentkv_time_to_first_token_seconds_count 2\n"));
  EXPECT_TRUE(has("agentkv_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_TRUE(has("# TYPE agentkv_queue_length gauge\nagentkv_queue_length 3\n"));
  EXPECT_TRUE(has("agentkv_kv_blocks{state=\"free\"} 7\n"));
  // Every line is a comment or "name[{labels}] value".
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    const std::string line = text.substr(pos, nl - pos);
    if (line[0] != '#') {
      EXPECT_NE(line.rfind(' '), std::string::npos) << line;
      EXPECT_EQ(line.rfind("agentkv_", 0), 0u) << line;
    }
    pos = nl + 1;
  }
}

TEST(MetricsTest, HitRateIsZeroWithoutPrompts) {
  Metrics m;
  EXPECT_NE(m.Render({}).find("agentkv_prefix_cache_hit_rate 0\n"), std::string::npos);
}

}  // namespace
}  // namespace agentkv::api
