#include "agent/agent_strands.h"

namespace agentkv::agent {

void AgentStrands::Post(const std::string& agent, Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Queue& q = queues_[agent];
    q.tasks.push_back(std::move(task));
    if (q.busy) return;
    q.busy = true;
  }
  Dispatch(agent);
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
  Dispatch(agent);
}

void AgentStrands::Dispatch(const std::string& agent) {
  while (true) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = queues_.find(agent);
      if (it == queues_.end()) return;
      Queue& q = it->second;
      if (q.tasks.empty()) {
        queues_.erase(it);  // idle: forget the agent
        return;
      }
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
      q.dispatching = true;
      q.done_early = false;
    }
    if (task) task();
    std::lock_guard<std::mutex> lock(mu_);
    Queue& q = queues_[agent];
    q.dispatching = false;
    if (!q.done_early) return;  // still running; its Done dispatches the next
  }
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
