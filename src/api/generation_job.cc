#include "api/generation_job.h"

namespace agentkv::api {

GenerationJob::GenerationJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn,
                             text::output::OutputParserOptions parser, bool stream,
                             nlohmann::ordered_json new_messages, std::string endpoint)
    : stream_(stream),
      ctx_(ctx),
      turn_(std::move(turn)),
      parser_(parser),
      new_messages_(std::move(new_messages)),
      endpoint_(std::move(endpoint)),
      parser_options_(std::move(parser)) {}

GenerationJob::~GenerationJob() {
  // A turn being recorded finishes on its worker: the generation is over
  // and its history is written even when the client has gone.
  if (!done_ && !recording_started_) turn_->Cancel();
  CancelChoices();
}

agent::PrepareFn GenerationJob::WithChoices(agent::PrepareFn prepare,
                                            std::shared_ptr<ChoiceSource> source) {
  return [prepare = std::move(prepare), source = std::move(source)]() -> Result<agent::TurnStart> {
    Result<agent::TurnStart> r = prepare();
    if (r.ok()) {
      std::lock_guard<std::mutex> lock(source->mu);
      source->engine = r->engine;
      source->keep_alive = r->keep_alive;
      source->request = r->request;
    }
    return r;
  };
}

uint64_t GenerationJob::ChoiceSeed(uint64_t seed, int index) {
  if (index == 0) return seed;
  // SplitMix64 of the seed offset by the index: distinct streams per choice,
  // the same ones on every run.
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void GenerationJob::SetChoices(int n, std::shared_ptr<ChoiceSource> source) {
  num_choices_ = n;
  source_ = std::move(source);
}

bool GenerationJob::SubmitChoices(std::string* out) {
  extras_submitted_ = true;
  if (num_choices_ <= 1) return true;
  engine::Engine* engine = nullptr;
  engine::EngineRequest base;
  {
    std::lock_guard<std::mutex> lock(source_->mu);
    engine = source_->engine;
    base = source_->request;
  }
  if (engine == nullptr) {
    Fail(Internal("the extra choices have no engine request to copy"), 500, out);
    return false;
  }
  base.agent_key.clear();
  for (int i = 1; i < num_choices_; ++i) {
    engine::EngineRequest r = base;
    if (base.params.seed) r.params.seed = ChoiceSeed(*base.params.seed, i);
    Result<engine::RequestHandle> h = engine->Submit(std::move(r));
    if (!h.ok()) {
      CancelChoices();
      turn_->Cancel();
      Fail(h.status(), HttpStatusFor(h.status()), out);
      return false;
    }
    Extra e;
    e.handle = std::move(h).value();
    e.parser = std::make_unique<text::output::OutputParser>(parser_options_);
    e.handle.stream->SetNotifier(wake_);
    extras_.push_back(std::move(e));
  }
  return true;
}

void GenerationJob::CancelChoices() {
  if (extras_.empty()) return;
  engine::Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(source_->mu);
    engine = source_->engine;
  }
  for (Extra& e : extras_) {
    if (!e.done && engine != nullptr) engine->Cancel(e.handle.id);
    e.done = true;
  }
}

bool GenerationJob::ChoicesDone() const {
  for (const Extra& e : extras_)
    if (!e.done) return false;
  return true;
}

bool GenerationJob::PollChoices(std::string* out) {
  for (size_t i = 0; i < extras_.size() && !done_; ++i) {
    Extra& x = extras_[i];
    const int choice = static_cast<int>(i) + 1;
    engine::RequestOutput ev;
    while (!x.done && x.handle.stream->TryPop(&ev)) {
      events_.clear();
      extra_completion_tokens_ += static_cast<int64_t>(ev.tokens.size());
      switch (ev.kind) {
        case engine::RequestOutput::Kind::kDelta:
          x.parser->Feed(ev.tokens, ev.text, &events_);
          OnEngineEvent(choice, events_, ev, out);
          break;
        case engine::RequestOutput::Kind::kFinished:
          x.parser->Feed(ev.tokens, ev.text, &events_);
          x.parser->Finish(&events_);
          OnEngineEvent(choice, events_, ev, out);
          x.done = true;
          if (ev.cancelled) {
            CancelChoices();
            turn_->Cancel();
            Fail(Cancelled("the request was cancelled"), 503, out);
            return false;
          }
          OnChoiceFinished(choice, ev, out);
          break;
        case engine::RequestOutput::Kind::kError:
          x.done = true;
          CancelChoices();
          turn_->Cancel();
          Fail(ev.error, 500, out);
          return false;
      }
    }
  }
  return !done_;
}

void GenerationJob::Start(std::function<void()> wake) {
  started_ = true;
  start_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(recording_->mu);
    recording_->wake = wake;
  }
  wake_ = wake;
  agent::AgentTurn::Start(turn_, std::move(wake));
}

void GenerationJob::Cancel() {
  if (!done_) {
    if (!recording_started_) turn_->Cancel();
    CancelChoices();
    Done(499);  // nginx's "client closed request", for metrics only
  }
}

void GenerationJob::Recorded(const Result<uint32_t>& n, const engine::RequestOutput& finished,
                             std::string* out) {
  if (!n.ok()) {
    Fail(n.status().WithContext("recording the turn"), 500, out);
    return;
  }
  turn_number_ = *n;
  if (ctx_.metrics) {
    ctx_.metrics->CountTokens(finished.prompt_tokens, finished.cached_tokens,
                              finished.completion_tokens + extra_completion_tokens_);
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
  if (main_finished_) {
    // Choice 0 has finished; the others still run.
    if (!PollChoices(out)) return true;
    if (!ChoicesDone()) return false;
    const engine::RequestOutput ev = *main_finished_;
    main_finished_.reset();
    return FinishTurn(ev, out);
  }
  std::shared_ptr<engine::TokenStream> stream = turn_->stream();
  engine::RequestOutput ev;
  while (!done_ && stream && stream->TryPop(&ev)) {
    if (!extras_submitted_ && !SubmitChoices(out)) return true;
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
      case engine::RequestOutput::Kind::kDelta:
        parser_.Feed(ev.tokens, ev.text, &events_);
        OnEngineEvent(0, events_, ev, out);
        break;
      case engine::RequestOutput::Kind::kFinished: {
        parser_.Feed(ev.tokens, ev.text, &events_);
        parser_.Finish(&events_);
        OnEngineEvent(0, events_, ev, out);
        if (ev.cancelled) {
          turn_->Cancel();
          CancelChoices();
          Fail(Cancelled("the request was cancelled"), 503, out);
          break;
        }
        if (!PollChoices(out)) return true;
        if (!ChoicesDone()) {
          main_finished_ = ev;
          return false;
        }
        return FinishTurn(ev, out);
      }
      case engine::RequestOutput::Kind::kError:
        turn_->Cancel();
        CancelChoices();
        Fail(ev.error, 500, out);
        break;
    }
  }
  if (!done_ && !PollChoices(out)) return true;
  return done_;
}

bool GenerationJob::FinishTurn(const engine::RequestOutput& ev, std::string* out) {
  nlohmann::ordered_json record = new_messages_;
  record.push_back(ReplyMessage());
  std::string text = record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  if (ctx_.workers == nullptr) {
    Recorded(turn_->Complete(text, generated_, ev), ev, out);
    return true;
  }
  // The history's fsync (and the agent's next turn, which starts when this
  // one is recorded) run on a worker; its wake brings the result back to
  // Poll.
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

}  // namespace agentkv::api
