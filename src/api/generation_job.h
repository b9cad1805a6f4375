// GenerationJob: an AsyncBody over one engine request. It drains the
// request's TokenStream, runs the model's OutputParser (reasoning, tool
// calls) over the text and hands the parsed events to the protocol
// subclass, which formats them as a whole JSON reply or as SSE events.
//
// Thread-safety: as AsyncBody: Start / Poll / Cancel on one strand. Owns its
// RequestHandle; cancels the request if destroyed before it finished.
#pragma once

#include <string>
#include <vector>

#include "api/http_types.h"
#include "engine/engine.h"
#include "engine/output_parser.h"

namespace agentkv::api {

class GenerationJob : public AsyncBody {
 public:
  GenerationJob(Engine* engine, RequestHandle handle, OutputParserOptions parser, bool stream,
                int64_t prompt_tokens);
  ~GenerationJob() override;

  bool streaming() const override { return stream_; }
  void Start(std::function<void()> wake) override;
  bool Poll(std::string* out) override;
  int status() const override { return status_; }
  void Cancel() override;

 protected:
  // Called once, on the first Poll, before any event.
  virtual void OnBegin(std::string* out) { (void)out; }
  virtual void OnEvents(const std::vector<OutputEvent>& events, std::string* out) = 0;
  virtual void OnFinish(const RequestOutput& finished, std::string* out) = 0;
  virtual void OnError(const Status& error, std::string* out) = 0;

  bool stream_;
  int status_ = 200;
  int64_t prompt_tokens_;
  int32_t num_tool_calls() const { return parser_.num_tool_calls(); }

 private:
  Engine* engine_;
  RequestHandle handle_;
  OutputParser parser_;
  std::vector<OutputEvent> events_;
  bool begun_ = false;
  bool done_ = false;
};

}  // namespace agentkv::api
