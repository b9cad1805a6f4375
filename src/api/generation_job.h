// GenerationJob: an AsyncBody over one agent turn. Start() queues the turn
// on its agent's strand; once it runs, the job drains the engine request's
// TokenStream, runs the model's OutputParser (reasoning, tool calls) over
// the text and hands the parsed events to the protocol subclass, which
// formats them as a whole JSON reply or as SSE events. When the request
// finishes, the turn's new messages and the reply are appended to the
// agent's history (durably, before the last bytes of the response are
// produced), then the subclass writes its final event. Recording runs on
// the context's worker pool (an fsync, and the agent's next turn starting
// behind it): Poll hands it over and the wake brings the result back. It
// also feeds the server's metrics (TTFT, inter-token latency, tokens,
// requests).
//
// Thread-safety: as AsyncBody: Start / Poll / Cancel on one strand. Shares
// its AgentTurn with the agent's strand; cancels it if destroyed before it
// finished. Borrows the ApiContext's objects.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_turn.h"
#include "api/agent_binding.h"
#include "api/http_types.h"
#include "engine/engine.h"
#include "engine/text/output/output_parser.h"

namespace agentkv::api {

class GenerationJob : public AsyncBody {
 public:
  // `new_messages`: the messages this turn adds to the history (OpenAI
  // shape); the reply (ReplyMessage) is appended to them. `endpoint`: the
  // route, for metrics.
  GenerationJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn, OutputParserOptions parser,
                bool stream, nlohmann::ordered_json new_messages, std::string endpoint);
  ~GenerationJob() override;

  bool streaming() const override { return stream_; }
  void Start(std::function<void()> wake) override;
  bool Poll(std::string* out) override;
  int status() const override { return status_; }
  void Cancel() override;

 protected:
  // Called once, on the first Poll after the turn started running, before
  // any event; prompt_tokens_ is known then.
  virtual void OnBegin(std::string* out) { (void)out; }
  virtual void OnEvents(const std::vector<OutputEvent>& events, std::string* out) = 0;
  // After the history was recorded (turn_number_ is set).
  virtual void OnFinish(const RequestOutput& finished, std::string* out) = 0;
  // status_ is set (HttpStatusFor the error, 500 for engine errors) before.
  virtual void OnError(const Status& error, std::string* out) = 0;
  // The assistant message this turn produced, for the history.
  virtual nlohmann::ordered_json ReplyMessage() const = 0;

  bool stream_;
  int status_ = 200;
  int64_t prompt_tokens_ = 0;
  uint32_t turn_number_ = 0;
  const std::string& agent_id() const { return turn_->agent_id(); }
  int32_t num_tool_calls() const { return parser_.num_tool_calls(); }
  // Every output token so far.
  const std::vector<int32_t>& generated() const { return generated_; }

 private:
  void Fail(const Status& error, int status, std::string* out);
  void Done(int status);
  // The turn was recorded (or failed to be): the reply's end.
  void Recorded(const Result<uint32_t>& n, const RequestOutput& finished, std::string* out);

  // Shared with the worker that records the turn (it may outlive the job).
  struct Recording {
    std::mutex mu;
    std::function<void()> wake;
    std::optional<Result<uint32_t>> result;
  };
  std::shared_ptr<Recording> recording_ = std::make_shared<Recording>();
  bool recording_started_ = false;
  RequestOutput finished_;

  ApiContext ctx_;
  std::shared_ptr<agent::AgentTurn> turn_;
  OutputParser parser_;
  nlohmann::ordered_json new_messages_;
  std::string endpoint_;
  std::vector<OutputEvent> events_;
  std::vector<int32_t> generated_;
  std::chrono::steady_clock::time_point start_, last_token_;
  bool started_ = false, begun_ = false, done_ = false, first_token_ = false;
};

}  // namespace agentkv::api
