// Engine: the engine thread. It owns the backend, the KV cache manager and
// the scheduler; other threads talk to it only through Submit / Cancel /
// Drain / Stats, which queue work for it. Each request's output streams back
// through its own TokenStream.
//
// Every step: apply queued submissions and cancellations (a cancelled
// request's blocks are free before the next step), plan with the Scheduler,
// let the backend copy blocks (copy-on-write) and run the forward pass,
// sample each sequence with its own Sampler, detokenize and stop-check, push
// events, and retire finished sequences (pinning their KV for their agent).
//
// Thread-safety: public methods are thread-safe. The backend is touched only
// by the engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "cache/kv_cache_manager.h"
#include "engine/backend.h"
#include "engine/scheduler.h"
#include "engine/token_stream.h"

namespace agentkv {

class Tokenizer;

struct EngineOptions {
  SchedulerOptions scheduler;
  int block_size = 16;
  // KV memory: blocks per group given directly, else sized from
  // kv_memory_bytes.
  std::vector<int32_t> blocks_per_group;
  uint64_t kv_memory_bytes = 256ull << 20;
  bool prefix_caching = true;
  int32_t max_context = 0;  // 0: the model's max_position_embeddings
};

struct EngineStats {
  int64_t steps = 0;
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;      // computed by prefill
  int64_t generated_tokens = 0;
  int64_t last_batch_size = 0;    // sequences in the last step
  int64_t max_batch_size = 0;     // largest step so far
  int64_t resident_agents = 0;
  std::vector<BlockPoolStats> pools;  // per cache group
};

struct RequestHandle {
  RequestId id = 0;
  std::shared_ptr<TokenStream> stream;
};

class Engine {
 public:
  // `tokenizer` (may be null: no text in the events, no stop strings) must
  // outlive the engine. Starts the engine thread.
  static Result<std::unique_ptr<Engine>> Create(std::unique_ptr<Backend> backend,
                                                const Tokenizer* tokenizer,
                                                EngineOptions options);
  ~Engine();  // Stop()s

  // Queues a request. InvalidArgument for bad parameters or a prompt that
  // does not fit the context; Unavailable-like kCancelled once draining.
  Result<RequestHandle> Submit(EngineRequest request);
  // Cancels a request (no-op if it already ended); its stream gets a
  // kFinished event with cancelled set.
  void Cancel(RequestId id);
  // Forgets an agent's resident KV.
  void DropAgent(const std::string& agent_key);
  // Stops admitting new requests and waits until every queued and running
  // request has finished.
  void Drain();
  // Cancels everything and joins the engine thread.
  void Stop();
  // Stop()s and hands the backend back (to build another engine on it).
  std::unique_ptr<Backend> ReleaseBackend();

  EngineStats Stats() const;
  const ModelConfig& config() const { return backend_->config(); }
  int32_t max_context() const { return max_context_; }
  int block_size() const { return options_.block_size; }

 private:
  Engine(std::unique_ptr<Backend> backend, const Tokenizer* tokenizer, EngineOptions options);
  void Loop();
  void Step();
  void Finish(Sequence* s, FinishReason reason, bool cancelled, std::string tail);
  void Fail(Sequence* s, const Status& error);
  void PublishStats();
  double Now() const;

  std::unique_ptr<Backend> backend_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  int32_t max_context_ = 0;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::chrono::steady_clock::time_point start_;

  // Inbox, guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wakes Drain()
  std::deque<std::unique_ptr<Sequence>> submitted_;
  std::vector<RequestId> cancelled_;
  std::vector<std::string> dropped_agents_;
  bool stopping_ = false;
  bool draining_ = false;
  bool idle_ = true;
  RequestId next_id_ = 1;
  EngineStats stats_;  // published copy

  // Engine-thread state.
  std::unordered_map<std::string, AgentCache> agents_;
  std::vector<SeqStep> steps_buf_;
  std::vector<float> logits_;
  EngineStats local_;
  std::thread thread_;
};

}  // namespace agentkv
