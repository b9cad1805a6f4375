// ThreadPool: a fixed set of workers for data-parallel loops inside one call
// (the CPU forward pass). Idle workers sleep on a condition variable rather
// than spin, so an oversubscribed machine (CI runs tests in parallel on two
// cores) does not lose whole time slices to spinning threads.
//
// Thread-safety: ParallelFor may be called from one thread at a time (the
// engine thread); the callback runs concurrently on up to size() threads,
// the caller included.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace agentkv {

class ThreadPool {
 public:
  // `threads` counts the calling thread; 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i, thread_index) for every i in [0, n), in chunks of `grain`,
  // and returns when all calls have returned. thread_index < size().
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int)>& fn);

 private:
  void Worker(int index);
  void RunChunks(int thread_index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int active_ = 0;
  // The current loop.
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace agentkv
