// AgentStrands: one strand (ordered queue) per agent. Tasks posted for an
// agent start strictly one after another in the order they were posted; a
// task holds its agent's strand from the moment it starts until someone
// calls Done(agent) for it, which may be long after the task's function
// returned (an asynchronous turn: it submits to the engine and returns; the
// connection that streams the reply calls Done once the turn is recorded).
// Tasks of different agents never wait for each other.
//
// Without an executor, a task's function runs on the thread that posted it
// (when the agent was idle) or on the thread that called Done for the
// previous task. With one, Post and Done hand the starting of tasks to the
// executor (a worker pool), so tasks that block (rendering, tokenizing, the
// store) never run on the caller's thread (an HTTP io thread). Done may be
// called from inside the task itself (a cancelled or failed turn): the next
// task then starts after the current one returns, iteratively, never
// recursively.
//
// A task that throws counts as Done (it must not also arrange a Done for
// later): the tasks behind it start, then the exception propagates to the
// thread that ran it (the caller of Post or Done).
//
// Thread-safety: every method may be called from any thread. Done must be
// called exactly once per started task that returns normally.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace agentkv::agent {

class AgentStrands {
 public:
  using Task = std::function<void()>;
  // Runs a function soon on another thread; null: inline.
  using Executor = std::function<void(std::function<void()>)>;

  explicit AgentStrands(Executor executor = nullptr) : executor_(std::move(executor)) {}

  // Queues `task` behind every earlier task of `agent`; starts it now when
  // the agent is idle.
  void Post(const std::string& agent, Task task);
  // The running task of `agent` is over: starts the next one, if any.
  void Done(const std::string& agent);

  // Tasks of `agent` posted and not yet Done (running one included).
  size_t Pending(const std::string& agent) const;
  // Agents with a running task.
  size_t BusyAgents() const;

 private:
  struct Queue {
    std::deque<Task> tasks;
    bool busy = false;         // a task has started and is not Done
    bool dispatching = false;  // a thread is inside Dispatch's task call
    bool done_early = false;   // Done came while dispatching
  };
  // Runs tasks of `agent` while they complete synchronously. The caller has
  // set busy.
  void Dispatch(const std::string& agent);
  // Dispatch, inline or on the executor.
  void Kick(const std::string& agent);

  const Executor executor_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Queue> queues_;
};

}  // namespace agentkv::agent
