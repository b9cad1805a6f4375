#include "util/task_pool.h"

#include <algorithm>
#include <exception>
#include <iostream>

namespace agentkv {

TaskPool::TaskPool(int threads, std::string name) : name_(std::move(name)) {
  const int n = std::max(1, threads);
  workers_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { Worker(); });
}

TaskPool::~TaskPool() { Stop(); }

void TaskPool::RunOne(const Task& task, const std::string& name) {
  try {
    task();
  } catch (const std::exception& e) {
    std::cerr << name << ": a task failed: " << e.what() << "\n";
  } catch (...) {
    std::cerr << name << ": a task failed\n";
  }
}

void TaskPool::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  RunOne(task, name_);
}

void TaskPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  workers_.clear();
}

size_t TaskPool::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size() + running_;
}

bool TaskPool::OnWorker() const {
  const auto me = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(workers_.begin(), workers_.end(),
                     [&](const std::thread& t) { return t.get_id() == me; });
}

void TaskPool::Worker() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and everything posted before ran
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    ++running_;
    lock.unlock();
    RunOne(task, name_);
    task = nullptr;  // its captures go before the next wait
    lock.lock();
    --running_;
  }
}

}  // namespace agentkv
