#include "agent/agent_turn.h"

#include <exception>

#include "agent/agent_manager.h"

namespace agentkv::agent {

AgentTurn::AgentTurn(AgentManager* manager, std::string agent_id, PrepareFn prepare)
    : manager_(manager), agent_id_(std::move(agent_id)), prepare_(std::move(prepare)) {}

AgentTurn::~AgentTurn() { Cancel(); }

void AgentTurn::Start(const std::shared_ptr<AgentTurn>& self, std::function<void()> wake) {
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    if (self->started_) return;
    self->started_ = true;
    self->wake_ = std::move(wake);
  }
  self->queued_behind_ = self->manager_->strands().Pending(self->agent_id_);
  // The strand holds the turn until it has run.
  self->manager_->strands().Post(self->agent_id_, [self] { self->Run(); });
}

void AgentTurn::Run() {
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled = state_ != State::kQueued;  // cancelled while queued
  }
  if (cancelled) return Release();
  // Whether the agent has a recorded turn: if it has none, this turn
  // creates it, and should it end unrecorded, the KV the engine kept under
  // the agent's key belongs to no agent anyone can list or delete.
  new_agent_ = !manager_->HasHistory(agent_id_);
  Result<TurnStart> start = Internal("not prepared");
  Result<engine::RequestHandle> handle = Internal("not submitted");
  // A throwing PrepareFn (or Submit) fails this turn only: left to the
  // strand, the exception would count as Done there while the turn stayed
  // queued, and its consumer would wait for it forever.
  try {
    start = prepare_ ? prepare_() : Result<TurnStart>(Internal("no prepare"));
    if (start.ok()) {
      if (start->engine == nullptr) {
        handle = Internal("no engine");
      } else {
        start->request.agent_key = agent_id_;
        prompt_ = start->request.prompt;
        handle = start->engine->Submit(std::move(start->request));
      }
    } else {
      handle = start.status();
    }
  } catch (const std::exception& e) {
    handle = Internal(std::string("preparing the turn failed: ") + e.what());
  } catch (...) {
    handle = Internal("preparing the turn failed");
  }
  std::function<void()> wake;
  std::shared_ptr<engine::TokenStream> stream;
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = wake_;
    if (!handle.ok()) {
      if (state_ == State::kQueued) {
        state_ = State::kFailed;
        error_ = handle.status();
      }
      release = true;
    } else {
      engine_ = start->engine;
      keep_alive_ = start->keep_alive;
      handle_ = std::move(handle).value();
      if (state_ == State::kCancelled) {
        engine_->Cancel(handle_.id);
        if (new_agent_) engine_->DropAgent(agent_id_);
        release = true;
      } else {
        state_ = State::kRunning;
        stream = handle_.stream;
      }
    }
  }
  if (release) {
    Release();
    if (wake) wake();
    return;
  }
  // Registering calls wake once if events are queued already.
  stream->SetNotifier(wake);
  if (wake) wake();
}

void AgentTurn::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return;
    released_ = true;
  }
  manager_->strands().Done(agent_id_);
}

AgentTurn::State AgentTurn::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

Status AgentTurn::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::shared_ptr<engine::TokenStream> AgentTurn::stream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handle_.stream;
}

std::vector<int32_t> AgentTurn::prompt() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prompt_;
}

Result<uint32_t> AgentTurn::Complete(const std::string& messages_json,
                                     std::span<const int32_t> generated,
                                     const engine::RequestOutput& finished) {
  std::vector<int32_t> prompt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kRunning) return Internal("turn is not running");
    state_ = State::kCompleted;
    prompt = prompt_;
  }
  Result<uint32_t> n = manager_->Record(agent_id_, messages_json, system_hash_);
  if (n.ok()) {
    manager_->NoteFinished(agent_id_, prompt, generated, finished);
  } else if (new_agent_ && engine_ != nullptr) {
    engine_->DropAgent(agent_id_);  // the agent was not created
  }
  if (handle_.stream) handle_.stream->SetNotifier(nullptr);
  Release();
  return n;
}

void AgentTurn::Cancel() {
  engine::Engine* engine = nullptr;
  engine::RequestId id = 0;
  bool was_running = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kCompleted || state_ == State::kCancelled) return;
    was_running = state_ == State::kRunning;
    const bool failed = state_ == State::kFailed;
    state_ = State::kCancelled;
    if (failed) return;  // released already
    engine = engine_;
    id = handle_.id;
  }
  if (was_running) {
    if (engine) {
      engine->Cancel(id);
      // The request may have finished already, its KV kept for the agent:
      // an agent whose first turn this was is never created, so nothing
      // would ever release that KV. The drop reaches the engine after the
      // cancellation, and before any later turn of the agent (this turn
      // still holds the strand).
      if (new_agent_) engine->DropAgent(agent_id_);
    }
    if (handle_.stream) handle_.stream->SetNotifier(nullptr);
    Release();
  }
  // Queued: Run() sees kCancelled and releases. Never started: nothing held.
}

}  // namespace agentkv::agent
