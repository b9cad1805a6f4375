#include "api/generation_job.h"

namespace agentkv::api {

GenerationJob::GenerationJob(Engine* engine, RequestHandle handle, OutputParserOptions parser,
                             bool stream, int64_t prompt_tokens)
    : stream_(stream),
      prompt_tokens_(prompt_tokens),
      engine_(engine),
      handle_(std::move(handle)),
      parser_(std::move(parser)) {}

GenerationJob::~GenerationJob() {
  if (!done_) engine_->Cancel(handle_.id);
  if (handle_.stream) handle_.stream->SetNotifier(nullptr);
}

void GenerationJob::Start(std::function<void()> wake) {
  handle_.stream->SetNotifier(std::move(wake));
}

void GenerationJob::Cancel() {
  if (!done_) engine_->Cancel(handle_.id);
  done_ = true;
}

bool GenerationJob::Poll(std::string* out) {
  if (!begun_) {
    begun_ = true;
    OnBegin(out);
  }
  RequestOutput ev;
  while (!done_ && handle_.stream->TryPop(&ev)) {
    events_.clear();
    switch (ev.kind) {
      case RequestOutput::Kind::kDelta:
        parser_.Feed(ev.text, &events_);
        if (!events_.empty()) OnEvents(events_, out);
        break;
      case RequestOutput::Kind::kFinished:
        parser_.Feed(ev.text, &events_);
        parser_.Finish(&events_);
        if (!events_.empty()) OnEvents(events_, out);
        done_ = true;
        OnFinish(ev, out);
        break;
      case RequestOutput::Kind::kError:
        done_ = true;
        OnError(ev.error, out);
        break;
    }
  }
  return done_;
}

}  // namespace agentkv::api
