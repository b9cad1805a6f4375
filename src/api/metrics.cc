#include "api/metrics.h"

#include <cstdio>

namespace agentkv::api {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Header(const std::string& name, const std::string& help, const char* type, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Metrics::Histogram::Observe(double v) {
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (v <= kBuckets[i]) ++counts[i];
  }
  ++count;
  sum += v;
}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::CountTokens(int64_t prompt, int64_t cached, int64_t output) {
  prompt_ += prompt;
  cached_ += cached;
  output_ += output;
}

void Metrics::ObserveTtft(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void Metrics::ObserveInterToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(seconds);
}

void Metrics::RenderHistogram(const char* name, const char* help, const Histogram& h,
                              std::string* out) {
  Header(name, help, "histogram", out);
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    *out += std::string(name) + "_bucket{le=\"" + Num(kBuckets[i]) + "\"} " +
            std::to_string(h.counts[i]) + "\n";
  }
  *out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
  *out += std::string(name) + "_sum " + Num(h.sum) + "\n";
  *out += std::string(name) + "_count " + std::to_string(h.count) + "\n";
}

std::string Metrics::Render(const std::vector<Sample>& extra) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Header("agentkv_requests_total", "HTTP requests answered, by endpoint and status", "counter",
           &out);
    for (const auto& [key, n] : requests_) {
      out += "agentkv_requests_total{endpoint=\"" + Escape(key.first) + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    }
    RenderHistogram("agentkv_time_to_first_token_seconds",
                    "Time from the request to its first output token", ttft_, &out);
    RenderHistogram("agentkv_inter_token_latency_seconds",
                    "Time between consecutive output chunks of a request", itl_, &out);
  }
  Header("agentkv_prompt_tokens_total", "Prompt tokens of finished generations", "counter", &out);
  out += "agentkv_prompt_tokens_total " + std::to_string(prompt_.load()) + "\n";
  Header("agentkv_cached_prompt_tokens_total",
         "Prompt tokens served from cache (resident, host or disk) instead of prefilled", "counter",
         &out);
  out += "agentkv_cached_prompt_tokens_total " + std::to_string(cached_.load()) + "\n";
  Header("agentkv_output_tokens_total", "Generated tokens of finished generations", "counter",
         &out);
  out += "agentkv_output_tokens_total " + std::to_string(output_.load()) + "\n";
  const int64_t p = prompt_.load();
  Header("agentkv_prefix_cache_hit_rate", "Cached prompt tokens / prompt tokens", "gauge", &out);
  out += "agentkv_prefix_cache_hit_rate " +
         Num(p > 0 ? static_cast<double>(cached_.load()) / static_cast<double>(p) : 0.0) + "\n";
  for (const Sample& s : extra) {
    Header(s.name, s.help, s.type.c_str(), &out);
    for (const auto& [labels, v] : s.values) {
      out += s.name + (labels.empty() ? "" : "{" + labels + "}") + " " + Num(v) + "\n";
    }
  }
  return out;
}

}  // namespace agentkv::api
