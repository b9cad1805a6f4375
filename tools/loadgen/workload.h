// What the load generator sends and how it reads the answers: prompt text
// of a given length in words, the request of one agent turn in each API
// (OpenAI chat completions, Anthropic messages, the agents API), and
// StreamReader, which follows one streamed response's SSE events and fills
// a TurnResult (text, arrival times, usage).
//
// Thread-safety: free functions are pure; a StreamReader belongs to one
// response.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sse_parser.h"

namespace agentkv::loadgen {

enum class Api { kOpenAi, kAnthropic, kAgents };

// "openai", "anthropic", "agents"; nullopt for anything else.
std::optional<Api> ParseApi(const std::string& name);
const char* ApiName(Api api);

struct WorkloadOptions {
  Api api = Api::kOpenAi;
  std::string model = "default";
  int output_tokens = 128;
  std::optional<float> temperature;  // absent: 0 (greedy, as `bench engine` runs)
  bool ignore_eos = true;            // every reply runs to output_tokens
};

// About `words` words (single-token English words separated by spaces),
// the same for the same seed.
std::string Words(uint64_t seed, int words);

struct Message {
  std::string role;  // "user" or "assistant"
  std::string content;
};

struct HttpCall {
  std::string path;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// The streamed request of one turn of agent `session_id`: `history` holds
// the earlier turns (user, assistant, ...) and ends with the new user
// message. The agents API keeps the history on the server, so only the new
// message goes out there.
HttpCall BuildTurn(const WorkloadOptions& options, const std::string& session_id,
                   const std::string& system, const std::vector<Message>& history);

// One request's outcome. Times are seconds since the request was sent.
struct TurnResult {
  int http_status = 0;      // 0: no HTTP response (connection error)
  std::string error;        // empty: the turn succeeded
  double ttft_s = -1;       // first output text; -1: none came
  double end_s = 0;         // the response's last byte
  double last_text_s = -1;  // last output text; -1: none came
  // When the request was sent, in seconds since the run's start (set by
  // the caller; the phases of a turn are measured from it).
  double sent_at_s = 0;
  std::vector<double> gaps_s;  // between consecutive events carrying output text
  int64_t prompt_tokens = -1, cached_tokens = -1, completion_tokens = -1;
  std::string text;  // the reply
  bool ok() const { return error.empty(); }
};

// Reads the SSE events of one streamed response in `api`'s shape.
class StreamReader {
 public:
  explicit StreamReader(Api api) : api_(api) {}
  // `t`: when the bytes carrying the event arrived.
  void OnEvent(const SseEvent& event, double t, TurnResult* result);
  // After the body ended: an error if the stream ended without its final
  // event or without usage.
  void Finish(TurnResult* result) const;

 private:
  void Text(const std::string& text, double t, TurnResult* result);

  Api api_;
  bool done_ = false;
  double last_text_ = -1;
};

}  // namespace agentkv::loadgen
