// Metrics: the server's counters and latency histograms, rendered in the
// Prometheus text exposition format (version 0.0.4) by GET /metrics:
// requests by endpoint and status, prompt / cached / output tokens, time to
// first token and inter-token latency histograms, the largest batch seen,
// plus gauges the caller samples at render time (queue, batch, pool, store,
// resume sources).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace agentkv::api {

class Metrics {
 public:
  // A request answered: `endpoint` is the route ("/v1/chat/completions",
  // "/v1/agents/generate", ...), `status` the HTTP status.
  void CountRequest(const std::string& endpoint, int status);
  // A generation finished.
  void CountTokens(int64_t prompt, int64_t cached, int64_t output);
  void ObserveTtft(double seconds);
  void ObserveInterToken(double seconds);

  int64_t prompt_tokens() const { return prompt_.load(); }
  int64_t cached_tokens() const { return cached_.load(); }

  struct Sample {
    std::string name, help, type;                        // type: "gauge" or "counter"
    std::vector<std::pair<std::string, double>> values;  // labels text ("" or a="b"), value
  };
  // The exposition text: this object's metrics followed by `extra`.
  std::string Render(const std::vector<Sample>& extra) const;

 private:
  static constexpr std::array<double, 14> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                      0.25,  0.5,    1,     2.5,  5,     10,   30};
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};
    uint64_t count = 0;
    double sum = 0;
    void Observe(double v);
  };
  static void RenderHistogram(const char* name, const char* help, const Histogram& h,
                              std::string* out);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_, itl_;
  std::atomic<int64_t> prompt_{0}, cached_{0}, output_{0};
};

}  // namespace agentkv::api
