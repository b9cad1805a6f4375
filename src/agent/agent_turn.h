// AgentTurn: one turn of one agent, from queueing on the agent's strand to
// the recorded history. Flow: Start() posts the turn on its agent's strand;
// when every earlier turn of the agent is over, the protocol layer's
// PrepareFn renders the prompt (it may read the history the earlier turns
// left) and the turn submits it to the engine with the agent's key, so the
// engine reuses and keeps the agent's KV (resident, then the store). The
// protocol layer drains stream(), and when the request has finished calls
// Complete(), which appends the turn to the history durably (before the
// response completes) and releases the strand for the agent's next turn.
// Cancel() (client gone) or a failure releases the strand without recording.
// A PrepareFn that throws fails the turn (as if it had returned an error).
// A turn that would have created its agent (no turn recorded yet) and ends
// unrecorded also drops the KV the engine may have kept under the agent's
// key: no agent exists to list, resume or delete it.
//
// Thread-safety: every method may be called from any thread; the strand
// calls the PrepareFn on some thread that is not the caller's. The turn
// borrows its AgentManager, which must outlive it. Destroying a turn that
// was started and not completed cancels it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "util/status.h"

namespace agentkv::agent {

class AgentManager;

// What the protocol layer hands a turn when it may run.
struct TurnStart {
  engine::Engine* engine = nullptr;
  // Keeps `engine` alive while the turn runs (the served model).
  std::shared_ptr<const void> keep_alive;
  engine::EngineRequest request;  // agent_key is set by the turn
};
using PrepareFn = std::function<Result<TurnStart>()>;

class AgentTurn {
 public:
  enum class State { kQueued, kRunning, kFailed, kCompleted, kCancelled };

  AgentTurn(AgentManager* manager, std::string agent_id, PrepareFn prepare);
  ~AgentTurn();
  AgentTurn(const AgentTurn&) = delete;
  AgentTurn& operator=(const AgentTurn&) = delete;

  // Queues the turn on its agent's strand. `wake` is called (any thread,
  // must not block) when the turn starts running, fails, or has output.
  // Call once. `self` must own this turn (the strand keeps it alive).
  static void Start(const std::shared_ptr<AgentTurn>& self, std::function<void()> wake);

  State state() const;
  // Why the turn failed (state kFailed).
  Status error() const;
  // The engine's output (state kRunning or later), else null.
  std::shared_ptr<engine::TokenStream> stream() const;
  // The prompt submitted (state kRunning or later).
  std::vector<int32_t> prompt() const;
  const std::string& agent_id() const { return agent_id_; }
  // Queued turns of the agent ahead of this one when it was started.
  size_t queued_behind() const { return queued_behind_; }

  // The engine finished the request (`finished` is its kFinished event and
  // `generated` every output token): appends `messages_json` (the turn's new
  // messages, JSON text) to the agent's history, durably, remembers the
  // agent's tokens for content matching and releases the strand. Returns the
  // turn number. The strand is released even when recording fails.
  Result<uint32_t> Complete(const std::string& messages_json, std::span<const int32_t> generated,
                            const engine::RequestOutput& finished);
  // Stops the turn: cancels its engine request, releases the strand. No-op
  // once completed.
  void Cancel();

  // Recorded with the agent when its first turn creates it.
  void set_system_hash(std::string h) { system_hash_ = std::move(h); }

 private:
  void Run();  // on the strand
  void Release();

  AgentManager* manager_;
  const std::string agent_id_;
  PrepareFn prepare_;
  std::string system_hash_;
  size_t queued_behind_ = 0;
  // The agent had no recorded turn when this one started (set on the
  // strand, before the turn is submitted).
  bool new_agent_ = false;

  mutable std::mutex mu_;
  State state_ = State::kQueued;
  bool started_ = false;
  bool released_ = false;
  Status error_;
  std::function<void()> wake_;
  engine::Engine* engine_ = nullptr;
  std::shared_ptr<const void> keep_alive_;
  engine::RequestHandle handle_;
  std::vector<int32_t> prompt_;
};

}  // namespace agentkv::agent
