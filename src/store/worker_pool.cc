#include "store/worker_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>

namespace agentkv::store {

WorkerPool::WorkerPool(int threads, int nice) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, nice] {
      if (nice > 0) LowerPriority(nice);
      Loop();
    });
  }
}

void LowerPriority(int nice) {
  // Linux: a thread's nice value is its own (PRIO_PROCESS with its tid). A
  // hint: failure (e.g. a sandbox without the permission) changes nothing.
  const int current = getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), std::max(current, nice));
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void WorkerPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  struct Call {
    std::atomic<size_t> next{0};
    size_t done = 0;
    std::mutex mu;
    std::condition_variable cv;
  };
  auto call = std::make_shared<Call>();
  // Each runner takes iterations until none are left; helpers that start
  // late find nothing to do, so the call never waits on a busy pool.
  auto run = [call, n, &fn] {
    size_t mine = 0;
    for (size_t i; (i = call->next.fetch_add(1)) < n; ++mine) fn(i);
    if (mine == 0) return;
    std::lock_guard lock(call->mu);
    call->done += mine;
    if (call->done == n) call->cv.notify_all();
  };
  const size_t helpers = std::min(threads_.size(), n - 1);
  if (helpers > 0) {
    std::lock_guard lock(mu_);
    for (size_t h = 0; h < helpers; ++h) jobs_.push_back(run);
  }
  cv_.notify_all();
  run();
  std::unique_lock lock(call->mu);
  call->cv.wait(lock, [&] { return call->done == n; });
}

}  // namespace agentkv::store
