// The load generator's numbers: per turn and in total, output tokens per
// second over the wall clock, TTFT and inter-token latency percentiles, the
// cached share of each turn's prompt (of the prompt, and of what the agent
// held after its previous turn: that prompt plus its reply), errors by
// status; printed as a table or as JSON, with the ratio to an engine-only
// throughput when one is given.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "workload.h"

namespace agentkv::loadgen {

// The p-quantile (0..1) of `v` by linear interpolation between closest
// ranks; 0 for an empty `v`.
double Percentile(std::vector<double> v, double p);

struct TurnSummary {
  int turn = 0;  // 1-based; 0 in the total
  int requests = 0, ok = 0;
  double wall_s = 0;
  int64_t output_tokens = 0;  // of successful requests, by usage
  double output_tok_s = 0;
  int short_replies = 0;  // successful, but fewer output tokens than asked
  double ttft_p50_ms = 0, ttft_p99_ms = 0, itl_p50_ms = 0, itl_p99_ms = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  double cached_share = 0;  // cached_tokens / prompt_tokens
  // cached tokens over the previous turn's prompt + reply, of the agents
  // that succeeded in both; absent on the first turn.
  std::optional<double> cached_of_previous;
  // Where the turn's wall time goes, in ms from its first request sent:
  // the last request sent, the first and the last first token, the last
  // output text of any request, and the turn's last byte. tail_*: per
  // request, from its last output text to its last byte (the final events:
  // usage, the durable history append before the response completes).
  double last_sent_ms = 0, first_token_ms = 0, last_first_token_ms = 0, last_text_ms = 0,
         last_byte_ms = 0, tail_p50_ms = 0, tail_max_ms = 0;
  std::map<std::string, int> errors;       // "429", "stream", "connection", ...
  std::vector<std::string> error_samples;  // a few messages
};

// `results[a]` is agent a's request of this turn; `previous` the same
// agents' previous turn, or null. `wall_s`: the turn's wall-clock time.
TurnSummary SummarizeTurn(int turn, const std::vector<TurnResult>& results,
                          const std::vector<TurnResult>* previous, double wall_s,
                          int expected_output);
// All turns together over `wall_s` (first request sent to last byte); the
// total's ratios weigh each request's tokens.
TurnSummary SummarizeAll(const std::vector<std::vector<TurnResult>>& turns, double wall_s,
                         int expected_output);

// Fills `s`'s phase fields from one turn's results (sent_at_s set).
void Phases(const std::vector<TurnResult>& results, TurnSummary* s);

nlohmann::json ToJson(const TurnSummary& s);
// The table: one row per turn, then the total; with `engine_tok_s`, each
// row's ratio to it.
std::string FormatTable(const std::vector<TurnSummary>& turns, const TurnSummary& total,
                        std::optional<double> engine_tok_s);

// The engine-only throughput from `agentkv bench engine --json` output:
// the level whose concurrency is `agents`, else the only level. nullopt
// and `error` set when there is none.
std::optional<double> EngineTokPerSecond(const std::string& bench_json, int agents,
                                         std::string* error);

}  // namespace agentkv::loadgen
