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
// Several choices (OpenAI `n`): choice 0 is the agent's turn; choices 1..n-1
// are plain engine requests (no agent key: they neither extend nor keep the
// agent's KV, and only choice 0 is recorded in its history) for the same
// prompt tokens, cache salt and priority, each with its own parser. They are
// submitted when choice 0's first event arrives: its prompt's full blocks
// are in the prefix cache by then, so the other choices share them and
// prefill only the partial last block (fewer than a block's tokens). The
// reply ends once every choice has finished; an error or cancellation of
// any choice ends them all.
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
  GenerationJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn,
                text::output::OutputParserOptions parser, bool stream,
                nlohmann::ordered_json new_messages, std::string endpoint);

  // What the extra choices copy from the turn's engine request: filled by
  // the PrepareFn that WithChoices wraps, on the agent's strand, before the
  // turn's stream exists.
  struct ChoiceSource {
    std::mutex mu;
    engine::Engine* engine = nullptr;
    std::shared_ptr<const void> keep_alive;
    engine::EngineRequest request;
  };
  // Wraps `prepare` so that the request it makes is recorded in `source`.
  static agent::PrepareFn WithChoices(agent::PrepareFn prepare,
                                      std::shared_ptr<ChoiceSource> source);
  // The seed of choice `index` for a request seeded with `seed`: `seed`
  // itself for choice 0, a distinct derived one for the others. Pure.
  static uint64_t ChoiceSeed(uint64_t seed, int index);
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
  virtual void OnEvents(const std::vector<text::output::OutputEvent>& events, std::string* out) = 0;
  // Every engine event of choice `choice` (0 is the turn's), with the
  // events its parser made of it (possibly none). The default hands
  // choice 0's non-empty events to OnEvents; subclasses with logprobs or
  // several choices override it.
  virtual void OnEngineEvent(int choice, const std::vector<text::output::OutputEvent>& events,
                             const engine::RequestOutput& ev, std::string* out) {
    (void)ev;
    if (choice == 0 && !events.empty()) OnEvents(events, out);
  }
  // Extra choice `choice` (>= 1) finished (`finished` is its kFinished
  // event), before choice 0's OnFinish.
  virtual void OnChoiceFinished(int choice, const engine::RequestOutput& finished,
                                std::string* out) {
    (void)choice, (void)finished, (void)out;
  }
  // After the history was recorded (turn_number_ is set).
  virtual void OnFinish(const engine::RequestOutput& finished, std::string* out) = 0;
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
  // Asks for `n` - 1 extra choices (see above) copying `source`, which the
  // turn's PrepareFn fills (WithChoices). Call before Start.
  void SetChoices(int n, std::shared_ptr<ChoiceSource> source);
  // Output tokens of the extra choices, all together (usage).
  int64_t extra_completion_tokens() const { return extra_completion_tokens_; }

 private:
  void Fail(const Status& error, int status, std::string* out);
  // Submits the extra choices; false (after Fail) when one is refused.
  bool SubmitChoices(std::string* out);
  void CancelChoices();
  // Drains the extra choices' streams; false when the job failed.
  bool PollChoices(std::string* out);
  bool ChoicesDone() const;
  // Choice 0 finished and every extra choice too: records the turn. true
  // when the reply is complete, false while the recording runs.
  bool FinishTurn(const engine::RequestOutput& ev, std::string* out);
  void Done(int status);
  // The turn was recorded (or failed to be): the reply's end.
  void Recorded(const Result<uint32_t>& n, const engine::RequestOutput& finished, std::string* out);

  // Shared with the worker that records the turn (it may outlive the job).
  struct Recording {
    std::mutex mu;
    std::function<void()> wake;
    std::optional<Result<uint32_t>> result;
  };
  std::shared_ptr<Recording> recording_ = std::make_shared<Recording>();
  bool recording_started_ = false;
  engine::RequestOutput finished_;

  ApiContext ctx_;
  std::shared_ptr<agent::AgentTurn> turn_;
  text::output::OutputParser parser_;
  nlohmann::ordered_json new_messages_;
  std::string endpoint_;
  std::vector<text::output::OutputEvent> events_;
  std::vector<int32_t> generated_;
  std::chrono::steady_clock::time_point start_, last_token_;

  struct Extra {
    engine::RequestHandle handle;
    std::unique_ptr<text::output::OutputParser> parser;
    bool done = false;
  };
  int num_choices_ = 1;
  std::shared_ptr<ChoiceSource> source_;
  text::output::OutputParserOptions parser_options_;
  std::vector<Extra> extras_;
  bool extras_submitted_ = false;
  std::optional<engine::RequestOutput> main_finished_;  // choice 0's, while others run
  int64_t extra_completion_tokens_ = 0;
  std::function<void()> wake_;
  bool started_ = false, begun_ = false, done_ = false, first_token_ = false;
};

}  // namespace agentkv::api
