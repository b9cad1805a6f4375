#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace agentkv::loadgen {
namespace {

using nlohmann::json;

std::string ErrorKey(const TurnResult& r) {
  if (r.http_status == 0) return "connection";
  if (r.http_status != 200) return std::to_string(r.http_status);
  return "stream";
}

void Accumulate(const TurnResult& r, TurnSummary* s, std::vector<double>* ttft,
                std::vector<double>* itl, int expected_output) {
  ++s->requests;
  if (!r.ok()) {
    ++s->errors[ErrorKey(r)];
    if (s->error_samples.size() < 5) s->error_samples.push_back(r.error);
    return;
  }
  ++s->ok;
  s->output_tokens += r.completion_tokens;
  if (r.completion_tokens < expected_output) ++s->short_replies;
  s->prompt_tokens += r.prompt_tokens;
  s->cached_tokens += std::max<int64_t>(0, r.cached_tokens);
  if (r.ttft_s >= 0) ttft->push_back(r.ttft_s);
  itl->insert(itl->end(), r.gaps_s.begin(), r.gaps_s.end());
}

void Finish(TurnSummary* s, std::vector<double> ttft, std::vector<double> itl) {
  s->output_tok_s = s->wall_s > 0 ? s->output_tokens / s->wall_s : 0;
  s->ttft_p50_ms = 1000 * Percentile(ttft, 0.5);
  s->ttft_p99_ms = 1000 * Percentile(ttft, 0.99);
  s->itl_p50_ms = 1000 * Percentile(itl, 0.5);
  s->itl_p99_ms = 1000 * Percentile(std::move(itl), 0.99);
  s->cached_share =
      s->prompt_tokens > 0 ? static_cast<double>(s->cached_tokens) / s->prompt_tokens : 0;
}

// Sums cached tokens and previous prompt + reply over agents that
// succeeded in both turns.
void AddPrevious(const std::vector<TurnResult>& now, const std::vector<TurnResult>& before,
                 int64_t* cached, int64_t* held) {
  for (size_t a = 0; a < now.size() && a < before.size(); ++a) {
    if (!now[a].ok() || !before[a].ok()) continue;
    *cached += std::max<int64_t>(0, now[a].cached_tokens);
    *held += before[a].prompt_tokens + before[a].completion_tokens;
  }
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

}  // namespace

void Phases(const std::vector<TurnResult>& results, TurnSummary* s) {
  double first_sent = 1e300;
  for (const TurnResult& r : results) first_sent = std::min(first_sent, r.sent_at_s);
  if (results.empty()) return;
  double first_token = 1e300, last_first_token = 0;
  std::vector<double> tails;
  for (const TurnResult& r : results) {
    const double sent = r.sent_at_s - first_sent;
    s->last_sent_ms = std::max(s->last_sent_ms, 1000 * sent);
    s->last_byte_ms = std::max(s->last_byte_ms, 1000 * (sent + r.end_s));
    if (r.ttft_s < 0) continue;
    first_token = std::min(first_token, sent + r.ttft_s);
    last_first_token = std::max(last_first_token, sent + r.ttft_s);
    s->last_text_ms = std::max(s->last_text_ms, 1000 * (sent + r.last_text_s));
    tails.push_back(r.end_s - r.last_text_s);
  }
  if (tails.empty()) return;
  s->first_token_ms = 1000 * first_token;
  s->last_first_token_ms = 1000 * last_first_token;
  s->tail_p50_ms = 1000 * Percentile(tails, 0.5);
  s->tail_max_ms = 1000 * Percentile(std::move(tails), 1.0);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

TurnSummary SummarizeTurn(int turn, const std::vector<TurnResult>& results,
                          const std::vector<TurnResult>* previous, double wall_s,
                          int expected_output) {
  TurnSummary s;
  s.turn = turn;
  s.wall_s = wall_s;
  std::vector<double> ttft, itl;
  for (const TurnResult& r : results) Accumulate(r, &s, &ttft, &itl, expected_output);
  if (previous != nullptr) {
    int64_t cached = 0, held = 0;
    AddPrevious(results, *previous, &cached, &held);
    if (held > 0) s.cached_of_previous = static_cast<double>(cached) / held;
  }
  Finish(&s, std::move(ttft), std::move(itl));
  Phases(results, &s);
  return s;
}

TurnSummary SummarizeAll(const std::vector<std::vector<TurnResult>>& turns, double wall_s,
                         int expected_output) {
  TurnSummary s;
  s.wall_s = wall_s;
  std::vector<double> ttft, itl;
  int64_t cached = 0, held = 0;
  for (size_t t = 0; t < turns.size(); ++t) {
    for (const TurnResult& r : turns[t]) Accumulate(r, &s, &ttft, &itl, expected_output);
    if (t > 0) AddPrevious(turns[t], turns[t - 1], &cached, &held);
  }
  if (held > 0) s.cached_of_previous = static_cast<double>(cached) / held;
  Finish(&s, std::move(ttft), std::move(itl));
  return s;
}

json ToJson(const TurnSummary& s) {
  json j = {{"requests", s.requests},
            {"ok", s.ok},
            {"wall_s", s.wall_s},
            {"output_tokens", s.output_tokens},
            {"output_tok_s", s.output_tok_s},
            {"short_replies", s.short_replies},
            {"ttft_ms", {{"p50", s.ttft_p50_ms}, {"p99", s.ttft_p99_ms}}},
            {"itl_ms", {{"p50", s.itl_p50_ms}, {"p99", s.itl_p99_ms}}},
            {"prompt_tokens", s.prompt_tokens},
            {"cached_tokens", s.cached_tokens},
            {"cached_share", s.cached_share},
            {"cached_of_previous", s.cached_of_previous ? json(*s.cached_of_previous) : json()},
            {"errors", s.errors},
            {"error_samples", s.error_samples}};
  if (s.turn > 0) {
    j["turn"] = s.turn;
    j["phases_ms"] = {{"last_sent", s.last_sent_ms},
                      {"first_token", s.first_token_ms},
                      {"last_first_token", s.last_first_token_ms},
                      {"last_text", s.last_text_ms},
                      {"last_byte", s.last_byte_ms},
                      {"tail_p50", s.tail_p50_ms},
                      {"tail_max", s.tail_max_ms}};
  }
  return j;
}

std::string FormatTable(const std::vector<TurnSummary>& turns, const TurnSummary& total,
                        std::optional<double> engine_tok_s) {
  const std::vector<std::pair<std::string, size_t>> cols = {
      {"turn", 5},      {"ok/req", 9},    {"out tok/s", 11}, {"wall s", 9},
      {"TTFT p50", 12}, {"TTFT p99", 12}, {"ITL p50", 11},   {"ITL p99", 11},
      {"prompt", 8},    {"cached", 8},    {"of prev", 8},    {"engine x", 10}};
  std::string out;
  for (size_t c = 0; c < cols.size(); ++c) {
    if (c == cols.size() - 1 && !engine_tok_s) break;
    out += Pad(cols[c].first, cols[c].second);
  }
  out += "\n";
  auto row = [&](const TurnSummary& s, const std::string& name) {
    std::vector<std::string> v = {
        name,
        std::to_string(s.ok) + "/" + std::to_string(s.requests),
        Fixed(s.output_tok_s, 0),
        Fixed(s.wall_s, 2),
        Fixed(s.ttft_p50_ms, 1) + "ms",
        Fixed(s.ttft_p99_ms, 1) + "ms",
        Fixed(s.itl_p50_ms, 2) + "ms",
        Fixed(s.itl_p99_ms, 2) + "ms",
        s.ok > 0 ? std::to_string(s.prompt_tokens / s.ok) : "-",
        Fixed(100 * s.cached_share, 1) + "%",
        s.cached_of_previous ? Fixed(100 * *s.cached_of_previous, 1) + "%" : "-",
        engine_tok_s && *engine_tok_s > 0 ? Fixed(s.output_tok_s / *engine_tok_s, 3) : "-"};
    for (size_t c = 0; c < cols.size(); ++c) {
      if (c == cols.size() - 1 && !engine_tok_s) break;
      out += Pad(v[c], cols[c].second);
    }
    out += "\n";
  };
  for (const TurnSummary& s : turns) row(s, std::to_string(s.turn));
  row(total, "all");
  out +=
      "(prompt: mean prompt tokens of a request; cached: cached share of the prompts; of prev: "
      "cached tokens over the previous turn's prompt + reply)\n";
  if (engine_tok_s) out += "engine alone: " + Fixed(*engine_tok_s, 0) + " output tok/s\n";
  for (const TurnSummary& s : turns) {
    for (const auto& [key, n] : s.errors) {
      out += "turn " + std::to_string(s.turn) + ": " + std::to_string(n) + " errors (" + key + ")";
      if (!s.error_samples.empty()) out += ", e.g. " + s.error_samples.front();
      out += "\n";
    }
    if (s.short_replies > 0) {
      out += "turn " + std::to_string(s.turn) + ": " + std::to_string(s.short_replies) +
             " replies shorter than asked (the server ignored ignore_eos?)\n";
    }
  }
  return out;
}

std::optional<double> EngineTokPerSecond(const std::string& bench_json, int agents,
                                         std::string* error) {
  const json j = json::parse(bench_json, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("levels") || !j["levels"].is_array() ||
      j["levels"].empty()) {
    *error = "not the JSON of `agentkv bench engine --json` (no levels)";
    return std::nullopt;
  }
  const json& levels = j["levels"];
  for (const json& l : levels) {
    if (l.value("concurrency", -1) == agents && l.contains("output_tok_s")) {
      return l["output_tok_s"].get<double>();
    }
  }
  if (levels.size() == 1 && levels[0].contains("output_tok_s")) {
    return levels[0]["output_tok_s"].get<double>();
  }
  *error = "bench engine's JSON has no level of concurrency " + std::to_string(agents);
  return std::nullopt;
}

}  // namespace agentkv::loadgen
