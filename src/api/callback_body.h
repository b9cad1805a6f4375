// CallbackBody: an AsyncBody whose whole response is produced by work that
// completes elsewhere (an agent's strand, a model swap thread). Start()
// calls `work` with a `reply` function; `reply` may be called once, from any
// thread; the response goes out on the connection's strand. Counts the
// response in the metrics under `endpoint`.
//
// Thread-safety: Start / Poll / Cancel on the connection's strand; `reply`
// from anywhere (it holds the shared state, not the body, so it may outlive
// a cancelled body).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/http_types.h"
#include "api/metrics.h"

namespace agentkv::api {

class CallbackBody : public AsyncBody {
 public:
  using ReplyFn = std::function<void(HttpResponse)>;
  using Work = std::function<void(ReplyFn reply)>;

  CallbackBody(Work work, Metrics* metrics, std::string endpoint)
      : work_(std::move(work)),
        metrics_(metrics),
        endpoint_(std::move(endpoint)),
        state_(std::make_shared<State>()) {}

  bool streaming() const override { return false; }
  void Start(std::function<void()> wake) override {
    std::shared_ptr<State> st = state_;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->wake = std::move(wake);
    }
    work_([st](HttpResponse r) {
      std::function<void()> wake;
      {
        std::lock_guard<std::mutex> lock(st->mu);
        if (st->response) return;
        st->response = std::move(r);
        wake = st->wake;
      }
      if (wake) wake();
    });
  }
  bool Poll(std::string* out) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->response) return false;
    status_ = state_->response->status;
    content_type_ = state_->response->content_type;
    *out += state_->response->body;
    if (metrics_) metrics_->CountRequest(endpoint_, status_);
    return true;
  }
  int status() const override { return status_; }
  std::string content_type() const override { return content_type_; }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->wake = nullptr;
  }

 private:
  struct State {
    std::mutex mu;
    std::function<void()> wake;
    std::optional<HttpResponse> response;
  };
  Work work_;
  Metrics* metrics_;
  std::string endpoint_;
  std::shared_ptr<State> state_;
  int status_ = 200;
  std::string content_type_ = "application/json";
};

}  // namespace agentkv::api
