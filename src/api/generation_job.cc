#include "api/generation_job.h"

namespace agentkv::api {

GenerationJob::GenerationJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn,
                             OutputParserOptions parser, bool stream,
                             nlohmann::ordered_json new_messages, std::string endpoint)
    : stream_(stream),
      ctx_(ctx),
      turn_(std::move(turn)),
      parser_(std::move(parser)),
      new_messages_(std::move(new_messages)),
      endpoint_(std::move(endpoint)) {}

GenerationJob::~GenerationJob() {
  // A turn being recorded finishes on its worker: the generation is over
  // and its history is written even when the client has gone.
  if (!done_ && !recording_started_) turn_->Cancel();
}

void GenerationJob::Start(std::function<void()> wake) {
  started_ = true;
  start_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(recording_->mu);
    recording_->wake = wake;
  }
  agent::AgentTurn::Start(turn_, std::move(wake));
}

void GenerationJob::Cancel() {
  if (!done_) {
    if (!recording_started_) turn_->Cancel();
    Done(499);  // nginx's "client closed request", for metrics only
  }
}

void GenerationJob::Recorded(const Result<uint32_t>& n, const RequestOutput& finished,
                             std::string* out) {
  if (!n.ok()) {
    Fail(n.status().WithContext("recording the turn"), 500, out);
    return;
  }
  turn_number_ = *n;
  if (ctx_.metrics) {
    ctx_.metrics->CountTokens(finished.prompt_tokens, finished.cached_tokens,
                              finished.completion_tokens);
  }
  OnFinish(finished, out);
  Done(status_);
}

void GenerationJob::Done(int status) {
  done_ = true;
  if (ctx_.metrics) ctx_.metrics->CountRequest(endpoint_, status);
}

void GenerationJob::Fail(const Status& error, int status, std::string* out) {
  status_ = status;
  OnError(error, out);
  Done(status);
}

bool GenerationJob::Poll(std::string* out) {
  if (done_) return true;
  if (recording_started_) {
    std::optional<Result<uint32_t>> n;
    {
      std::lock_guard<std::mutex> lock(recording_->mu);
      n = recording_->result;
    }
    if (!n) return false;
    Recorded(*n, finished_, out);
    return true;
  }
  switch (turn_->state()) {
    case agent::AgentTurn::State::kQueued:
      return false;
    case agent::AgentTurn::State::kFailed:
      Fail(turn_->error(), HttpStatusFor(turn_->error()), out);
      return true;
    case agent::AgentTurn::State::kCancelled:
      Fail(Cancelled("the request was cancelled"), 503, out);
      return true;
    default:
      break;
  }
  if (!begun_) {
    begun_ = true;
    prompt_tokens_ = static_cast<int64_t>(turn_->prompt().size());
    OnBegin(out);
  }
  std::shared_ptr<TokenStream> stream = turn_->stream();
  RequestOutput ev;
  while (!done_ && stream && stream->TryPop(&ev)) {
    events_.clear();
    if (!ev.tokens.empty()) {
      const auto now = std::chrono::steady_clock::now();
      if (ctx_.metrics) {
        if (!first_token_) {
          ctx_.metrics->ObserveTtft(std::chrono::duration<double>(now - start_).count());
        } else {
          ctx_.metrics->ObserveInterToken(std::chrono::duration<double>(now - last_token_).count());
        }
      }
      first_token_ = true;
      last_token_ = now;
      generated_.insert(generated_.end(), ev.tokens.begin(), ev.tokens.end());
    }
    switch (ev.kind) {
      case RequestOutput::Kind::kDelta:
        parser_.Feed(ev.tokens, ev.text, &events_);
        if (!events_.empty()) OnEvents(events_, out);
        break;
      case RequestOutput::Kind::kFinished: {
        parser_.Feed(ev.tokens, ev.text, &events_);
        parser_.Finish(&events_);
        if (!events_.empty()) OnEvents(events_, out);
        if (ev.cancelled) {
          turn_->Cancel();
          Fail(Cancelled("the request was cancelled"), 503, out);
          break;
        }
        nlohmann::ordered_json record = new_messages_;
        record.push_back(ReplyMessage());
        std::string text =
            record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        if (ctx_.workers == nullptr) {
          Recorded(turn_->Complete(text, generated_, ev), ev, out);
          break;
        }
        // The history's fsync (and the agent's next turn, which starts
        // when this one is recorded) run on a worker; its wake brings the
        // result back to Poll.
        recording_started_ = true;
        finished_ = ev;
        ctx_.workers->Post(
            [turn = turn_, st = recording_, text = std::move(text), generated = generated_, ev] {
              Result<uint32_t> n = turn->Complete(text, generated, ev);
              std::function<void()> wake;
              {
                std::lock_guard<std::mutex> lock(st->mu);
                st->result = std::move(n);
                wake = st->wake;
              }
              if (wake) wake();
            });
        return false;
      }
      case RequestOutput::Kind::kError:
        turn_->Cancel();
        Fail(ev.error, 500, out);
        break;
    }
  }
  return done_;
}

}  // namespace agentkv::api
