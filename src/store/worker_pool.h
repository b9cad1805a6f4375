// WorkerPool: a few threads that run the iterations of a ParallelFor; the
// store uses it to compress KV blocks before a group commit and to
// decompress a resumed prefix in parallel.
//
// Thread-safety: ParallelFor may be called from several threads at once;
// each call returns when all of its iterations have run. The destructor
// waits for running iterations; no call may be in progress then.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace agentkv::store {

// Lowers the calling thread's scheduling priority to at least `nice`.
void LowerPriority(int nice);

class WorkerPool {
 public:
  // `threads` <= 0 runs everything on the calling thread. `nice` > 0 lowers
  // the helper threads' scheduling priority (background work that must not
  // take cores from the engine or the HTTP threads).
  explicit WorkerPool(int threads, int nice = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs fn(i) for i in [0, n); the calling thread takes part.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace agentkv::store
