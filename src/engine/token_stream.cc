#include "engine/token_stream.h"

namespace agentkv::engine {

void TokenStream::Push(RequestOutput event) {
  std::shared_ptr<const std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    if (event.kind != RequestOutput::Kind::kDelta) closed_ = true;
    // A non-empty queue means the consumer has a wake-up pending already.
    if (q_.empty()) notify = notify_;
    q_.push_back(std::move(event));
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

bool TokenStream::TryPop(RequestOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (q_.empty()) return false;
  *out = std::move(q_.front());
  q_.pop_front();
  return true;
}

RequestOutput TokenStream::Pop() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !q_.empty(); });
  RequestOutput ev = std::move(q_.front());
  q_.pop_front();
  return ev;
}

void TokenStream::SetNotifier(std::function<void()> notify) {
  auto shared = notify ? std::make_shared<const std::function<void()>>(std::move(notify)) : nullptr;
  bool pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify_ = shared;
    pending = !q_.empty();
  }
  if (pending && shared) (*shared)();
}

bool TokenStream::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace agentkv::engine
