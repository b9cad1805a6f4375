// ModelHost: the model being served, swappable at run time (SPEC section 6).
// Requests take a reference with Current() and keep the model alive while
// they use it. Swap(dir): stop admitting (Current() returns null, callers
// answer 503), let the running and queued requests finish (Engine::Drain),
// flush every agent's KV to the store under the old model's fingerprint,
// stop the engine and drop the old model (its weights and pool go once the
// last request holding it is gone), load the new model with the same store,
// and resume. If the new model fails to load, the old one is loaded again.
// Agents and histories live in the store and the AgentManager, so they
// survive; KV is reused only under a matching fingerprint (the store tier).
//
// Thread-safety: every method may be called from any thread; Swap and
// Shutdown are serialized. Owns the ServedModel (shared with requests).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "api/served_model.h"

namespace agentkv::api {

class ModelHost {
 public:
  ModelHost(ServedModelOptions options, std::unique_ptr<ServedModel> model);
  ~ModelHost();

  // The model serving now, or null while a swap (or shutdown) is under way.
  std::shared_ptr<ServedModel> Current() const;

  struct SwapReport {
    std::string old_model, new_model;
    std::string old_fingerprint, new_fingerprint;
    double drain_s = 0, flush_s = 0, load_s = 0;
    std::string warning;  // a KV flush error (the swap went ahead: KV is a cache)
  };
  // Swaps to the checkpoint in `model_dir`. InvalidArgument / NotFound when
  // it cannot be loaded (the old model is serving again).
  Result<SwapReport> Swap(const std::string& model_dir);
  // Swap on the host's own worker thread, then `done` there with the
  // result. false (and `done` never runs) while another swap started this
  // way is under way. Shutdown and the destructor join the worker, so
  // nothing a swap uses is destroyed under it.
  using SwapDone = std::function<void(Result<SwapReport>)>;
  bool StartSwap(std::string model_dir, SwapDone done);
  // Completed swaps.
  int64_t swaps() const;

  // How long each part of a Shutdown took (the serve command logs them, so
  // a slow stop says where it waited).
  struct ShutdownTimes {
    double drain_s = 0, flush_s = 0, stop_s = 0;
    bool drained = true;  // false: the drain deadline cut running requests off
  };
  // Stops admitting, drains, flushes the KV tier and stops the engine
  // (SIGTERM). Current() is null afterwards. `times` may be null.
  Status Shutdown(ShutdownTimes* times = nullptr);

 private:
  // Drains, flushes and stops `m`'s engine; the flush's status.
  static Status Retire(ServedModel& m, double drain_seconds, ShutdownTimes* times);

  // Joins a finished or running StartSwap worker.
  void JoinWorker();

  ServedModelOptions options_;
  std::mutex worker_mu_;  // guards worker_ and worker_busy_
  std::thread worker_;
  bool worker_busy_ = false;
  std::mutex swap_mu_;  // one Swap / Shutdown at a time
  mutable std::mutex mu_;
  std::shared_ptr<ServedModel> current_;
  int64_t swaps_ = 0;
};

}  // namespace agentkv::api
