// TaskPool: a fixed set of threads running posted tasks, oldest first. For
// blocking work that must stay off threads that serve others (the HTTP io
// threads): history fsyncs, template rendering and tokenizing of big
// bodies, waits for the store's write-behind queue. Results go back the
// way the task arranges (a callback that posts to where it is wanted).
//
// A task that throws is a bug: the exception is logged and the worker goes
// on. Stop() runs every task posted before it, then joins; tasks posted
// after Stop() run inline on the poster's thread, so nothing is lost at
// shutdown.
//
// Thread-safety: every method may be called from any thread (Stop from one
// that is not a worker).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace agentkv {

class TaskPool {
 public:
  using Task = std::function<void()>;

  // `name` labels log lines.
  TaskPool(int threads, std::string name);
  ~TaskPool();  // Stop()s
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Post(Task task);
  void Stop();

  int threads() const { return static_cast<int>(workers_.size()); }
  // Tasks waiting and running now.
  size_t pending() const;
  // Whether the calling thread is one of this pool's workers.
  bool OnWorker() const;

 private:
  void Worker();
  static void RunOne(const Task& task, const std::string& name);

  const std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace agentkv
