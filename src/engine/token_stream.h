// TokenStream: the thread-safe channel from the engine thread to one
// request's consumer. The engine pushes RequestOutput events and never
// blocks; the consumer either blocks (Pop, for tools and tests) or registers
// a notifier that Boost.Asio code uses to post a handler to its strand and
// then drains with TryPop. The stream closes after a kFinished or kError
// event.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "engine/request.h"

namespace agentkv::engine {

class TokenStream {
 public:
  // Engine side.
  void Push(RequestOutput event);

  // Consumer side. TryPop returns false when nothing is queued now.
  bool TryPop(RequestOutput* out);
  // Blocks until an event is queued.
  RequestOutput Pop();
  // Called when a Push finds the queue empty (on the pushing thread,
  // outside the lock), and once at registration if events are already
  // queued. Must not block. A consumer woken must drain with TryPop until
  // it returns false: events pushed while others wait in the queue bring no
  // further call (at one event per token per stream, a wake-up each would
  // cost the engine thread a cross-thread post per token).
  void SetNotifier(std::function<void()> notify);

  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> q_;
  // Shared so that Push copies a pointer, not the function, per event.
  std::shared_ptr<const std::function<void()>> notify_;
  bool closed_ = false;
};

}  // namespace agentkv::engine
