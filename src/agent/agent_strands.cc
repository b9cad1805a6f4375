#include "agent/agent_strands.h"

#include <exception>

namespace agentkv::agent {

void AgentStrands::Post(const std::string& agent, Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Queue& q = queues_[agent];
    q.tasks.push_back(std::move(task));
    if (q.busy) return;
    q.busy = true;
  }
  Kick(agent);
}

void AgentStrands::Kick(const std::string& agent) {
  if (!executor_) return Dispatch(agent);
  executor_([this, agent] { Dispatch(agent); });
}

void AgentStrands::Done(const std::string& agent) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = queues_.find(agent);
    if (it == queues_.end() || !it->second.busy) return;  // not running: a misuse, ignored
    Queue& q = it->second;
    if (q.dispatching) {
      q.done_early = true;  // Dispatch continues once the task returns
      return;
    }
  }
  Kick(agent);
}

void AgentStrands::Dispatch(const std::string& agent) {
  std::exception_ptr error;
  while (true) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = queues_.find(agent);
      if (it == queues_.end()) break;
      Queue& q = it->second;
      if (q.tasks.empty()) {
        queues_.erase(it);  // idle: forget the agent
        break;
      }
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
      q.dispatching = true;
      q.done_early = false;
    }
    bool threw = false;
    try {
      if (task) task();
    } catch (...) {
      // The task is over (it counts as Done), and the strand with it: the
      // tasks behind it still run, and the exception reaches this caller
      // once they have been started.
      threw = true;
      if (!error) error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    Queue& q = queues_[agent];
    q.dispatching = false;
    if (!q.done_early && !threw) break;  // still running; its Done dispatches the next
  }
  if (error) std::rethrow_exception(error);
}

size_t AgentStrands::Pending(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(agent);
  if (it == queues_.end()) return 0;
  return it->second.tasks.size() + (it->second.busy ? 1 : 0);
}

size_t AgentStrands::BusyAgents() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, q] : queues_) n += q.busy ? 1 : 0;
  return n;
}

}  // namespace agentkv::agent
