// Engine: the engine thread. It owns the backend, the KV cache manager and
// the scheduler; other threads talk to it only through Submit / Cancel /
// Drain / Stats, which queue work for it. Each request's output streams back
// through its own TokenStream.
//
// Every step: apply queued submissions and cancellations (a cancelled
// request's blocks are free before the next step), plan with the Scheduler,
// let the backend copy blocks (copy-on-write) and launch the forward pass;
// then collect the previous step (pipelined) or this one: sample each
// sequence with its own Sampler, detokenize and stop-check, push events,
// and retire finished sequences (pinning their KV for their agent).
// Rows are picked where ChoosePickMode (engine/pick_mode.h) says: greedy
// and plain temperature / top_k / top_p / min_p rows by the backend (on a
// GPU without copying logits; the draw's uniform comes from the sequence's
// Sampler at launch), rows with penalties or logprobs by the Sampler on the
// host from copied logits. Only steps whose rows are all picked by the
// backend pipeline (RowPipelines): optimistically picked constrained rows
// too where EngineOptions::pipeline_grammar applies, a sequence whose pick
// the grammar rejects rolled back (RollBack).
// Moving KV between the pool, the host tier and the store (and the agents'
// residency) is KvTransfer's, driven from this thread.
//
// Pipelining: a launched step's picks go into its sequences' tokens as
// placeholders (Sequence::in_flight) and `computed` moves on, so the next
// plan continues after them; that step names the pick by row
// (SeqStep::prev_row). The KV cache manager is told of a step's tokens only
// once all of them are known (after the step before it is collected), so no
// placeholder is ever hashed into the prefix cache. A sequence that turns
// out to have finished is settled back to what a step-by-step run would
// leave (its real tokens, its committed KV) before it retires; the rows of
// a later step already launched for it are ignored.
//
// Thread-safety: public methods are thread-safe. The backend is touched only
// by the engine thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "cache/kv_tier.h"
#include "engine/backend/backend.h"
#include "engine/draft_policy.h"
#include "engine/finish_reason.h"
#include "engine/kv_transfer.h"
#include "engine/pick_mode.h"
#include "engine/restore_policy.h"
#include "engine/scheduler.h"
#include "engine/token_stream.h"
#include "util/thread_pool.h"

namespace agentkv::text {
class Tokenizer;
}  // namespace agentkv::text

namespace agentkv::engine {

struct EngineOptions {
  // scheduler.max_step_tokens <= 0: the backend's default_step_tokens().
  SchedulerOptions scheduler;
  int block_size = 16;
  // KV memory: blocks per group given directly, else kv_memory_bytes if
  // > 0, else kv_memory_fraction (0: the backend's default share) of the
  // memory free once the model and the step workspaces are in place (see
  // engine/kv_pool_sizing.h).
  std::vector<int32_t> blocks_per_group;
  uint64_t kv_memory_bytes = 0;
  double kv_memory_fraction = 0;
  bool prefix_caching = true;
  int32_t max_context = 0;  // 0: the model's max_position_embeddings
  // Where KV blocks go after a turn and come back from before a prefill
  // (the persistent store). Null: none. Shared with the caller, who may
  // Flush() it; must be bound to this backend's model and KV format.
  std::shared_ptr<cache::KvTier> kv_tier;
  // Restores from the tier go through this many bytes of staging per chunk
  // (pinned on a GPU; three chunks in flight). Small values only in tests.
  size_t restore_chunk_bytes = 64ull << 20;
  // Host staging for finished turns' KV on its way to the tier (pinned on a
  // GPU, read asynchronously), capped at the pool's size. When it is all
  // in flight, the rest of a turn's blocks wait (still in the pool) until
  // the tier gives chunks back: the engine thread never waits for the
  // store. Blocks evicted from the pool before their turn are not saved
  // (save_dropped_blocks).
  size_t save_staging_bytes = 512ull << 20;
  // Host-memory KV tier (engine/host_kv_tier.h) between the pool and
  // kv_tier: blocks the pool evicts and finished turns' blocks, LRU, in
  // this many bytes of host memory (pinned on a GPU). 0: none.
  uint64_t host_kv_memory_bytes = 0;
  // Pipelined steps: while the device runs a step in which every sequence
  // picks greedily, the engine plans and launches the next one (its tokens
  // are the device's picks) and only then handles the first one's output,
  // so the device does not wait for the host between steps. Off: each
  // step is collected before the next is planned (same output).
  bool pipeline = true;
  // Threads that sample a step's kHost rows (penalties or logprobs; each
  // row its own sampler
  // over the whole vocabulary: at 64 rows x 128k tokens, serial sampling
  // on the engine thread took ~90 ms a step on an H200 host). 0: up to 8,
  // as the machine has cores; 1: on the engine thread.
  int sample_threads = 0;
  // Optimistic picks of grammar-constrained rows (engine/pick_mode.h,
  // OptimisticGrammarPick): greedy and temperature-only constrained rows
  // are picked by the backend from the unmasked row, the host checks that
  // one token against the grammar, and masks and picks the row (read back
  // from the backend) only when the grammar rejects it. Same distribution.
  // kAuto: the backend picks such rows where it keeps logits rows and
  // picks on a device (UseOptimisticGrammar); kOn: wherever it keeps
  // logits rows (the CPU backend too). Elsewhere the host makes the same
  // optimistic pick from the row (Sampler::SampleOptimistic), so kAuto and
  // kOn give every request the same tokens on every backend. kOff: every
  // constrained row masked first on the host (the procedure before
  // optimistic picks: the same greedy tokens, other seeded draws).
  OptimisticGrammar optimistic_grammar = OptimisticGrammar::kAuto;
  // Pipelined steps with optimistically picked constrained rows: the next
  // step launches with the backend's picks before the grammar has checked
  // them; a sequence whose pick the grammar rejects is rolled back (its
  // row of the step launched meanwhile discarded, the corrected token fed
  // by the step after). Same output. Only where the backend keeps the
  // checked step's logits readable while the next one runs
  // (Backend::reads_kept_logits_in_flight) and with `pipeline`; the host's
  // logits rows are then two sets, used by alternate steps. Off: a step
  // with such rows is collected before the next launches.
  bool pipeline_grammar = true;
  // Restore or recompute (engine/restore_policy.h): for a prompt the store
  // holds, recompute a head of it while the rest loads, where the rates say
  // that is faster. False: always load everything the store has.
  bool split_restores = true;
  // What prefill costs on this device and model. Unknown (the default):
  // measured at start-up when calibrate_prefill (two timed prefill chunks,
  // well under a second on a GPU), else never split.
  PrefillCost prefill_cost;
  bool calibrate_prefill = false;
  // The store's delivery rate and latency assumed until its loads have
  // been timed (cold reads of a zstd store on an NVMe disk).
  double tier_bytes_per_s = 1e9;
  double tier_latency_s = 0.02;
  // Speculative decoding from the context (engine/draft_policy.h): drafts
  // looked up in each sequence's own tokens, verified in one step. Only on
  // backends with multi_logit_rows() (others: never drafted). max_draft is
  // clamped below block_size. A step with drafts is collected before the
  // next is planned (a draft needs the real last tokens), so while any
  // sequence could be drafted for, steps do not pipeline.
  SpeculativeOptions speculative;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t waiting = 0;
  int64_t running = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;  // computed by prefill
  int64_t generated_tokens = 0;
  int64_t last_batch_size = 0;  // sequences in the last step
  int64_t max_batch_size = 0;   // largest step so far
  int64_t resident_agents = 0;
  // Where finished requests' cached prompt tokens came from (the deepest
  // tier used), and the KV tier's traffic.
  int64_t resumed_resident = 0;
  int64_t resumed_host = 0;
  int64_t resumed_disk = 0;
  int64_t resumed_none = 0;          // nothing cached: full prefill
  int64_t restored_tokens = 0;       // prompt tokens written back from the tier
  int64_t restore_problems = 0;      // loads that stopped at a corrupt record or failed
  int64_t saved_blocks = 0;          // KV blocks handed to the tier (with data)
  int64_t loading = 0;               // requests waiting for a tier load
  double restore_load_seconds = 0;   // the loader's time in KvTier::LoadInto
  double restore_write_seconds = 0;  // the engine thread's time issuing its copies
  double save_seconds = 0;           // the engine thread's time handing KV to the tier
  double step_seconds = 0;           // in Step (scheduling, forward, sampling, output)
  double forward_seconds = 0;        // of which in the backend's launch and collect calls
  // The engine thread's time outside steps and waits: admitting requests,
  // restores, handing saved KV to the tiers, delivering output.
  double between_steps_seconds = 0;
  double device_seconds = 0;         // Backend::device_seconds()
  double graph_capture_seconds = 0;  // Backend::graph_capture_seconds()
  int64_t graphs_captured = 0;       // Backend::graphs_captured()
  int64_t graph_steps = 0;           // Backend::graph_steps()
  int64_t save_dropped_blocks = 0;   // not saved: evicted while waiting for staging
  // The host-memory tier (all 0 without one).
  int64_t host_restored_tokens = 0;  // tokens written back from it (admissions, preemptions)
  int64_t host_kv_capacity_bytes = 0;
  int64_t host_kv_bytes = 0;  // held by its blocks
  int64_t host_kv_blocks = 0;
  int64_t host_kv_hits = 0;  // blocks found in it
  int64_t host_kv_inserts = 0;
  int64_t host_kv_evictions = 0;
  // Restored blocks are copied into the pool asynchronously: the *_write_
  // seconds above and here are the engine thread's time issuing the copies;
  // the *_done_ ones sum, per host-tier restore or store chunk, the time
  // from issue until the engine saw the copies done (late by up to one loop
  // iteration): divide the bytes by those for a rate.
  double host_write_seconds = 0;  // issuing host-tier blocks' copies into the pool
  double host_write_done_seconds = 0;
  double restore_write_done_seconds = 0;  // store chunks only
  // Restore or recompute: store restores split with a recomputed head, the
  // tokens those heads held, the store's measured rate (bytes/s, 0 until a
  // load is timed) and the prefill cost in use (0: unknown).
  int64_t split_restores = 0;
  int64_t split_recomputed_tokens = 0;
  int64_t recomputed_restores = 0;  // the store had the prompt; recomputing was faster
  double tier_bytes_per_s = 0;
  double tier_latency_s = 0;
  double prefill_seconds_per_token = 0;
  double prefill_seconds_per_token_context = 0;
  // Speculative decoding: draft tokens verified, and of those accepted
  // (each accepted one is an output token that cost no step of its own).
  int64_t draft_tokens = 0;
  int64_t draft_accepted_tokens = 0;
  int64_t draft_steps = 0;  // sequence-steps that carried a draft
  // Optimistic picks of constrained rows (EngineOptions::optimistic_grammar):
  // rows picked so, and of those the ones the grammar rejected (masked and
  // picked again on the host).
  int64_t grammar_optimistic_rows = 0;
  int64_t grammar_rejected_rows = 0;
  // Rejected picks whose sequence had a later step in flight already
  // (EngineOptions::pipeline_grammar): that step's row was discarded.
  int64_t grammar_rolled_back_rows = 0;
  // Steps launched while the step before them was still in flight (that
  // one collected only after this one launched): the steps that overlapped
  // the host's work with the device's (EngineOptions::pipeline).
  int64_t pipelined_steps = 0;
  std::vector<cache::BlockPoolStats> pools;  // per cache group
};

struct RequestHandle {
  RequestId id = 0;
  std::shared_ptr<TokenStream> stream;
};

class Engine {
 public:
  // `tokenizer` (may be null: no text in the events, no stop strings) must
  // outlive the engine. Starts the engine thread.
  static Result<std::unique_ptr<Engine>> Create(std::unique_ptr<backend::Backend> backend,
                                                const text::Tokenizer* tokenizer,
                                                EngineOptions options);
  ~Engine();  // Stop()s

  // Queues a request. InvalidArgument for bad parameters or a prompt that
  // does not fit the context; Unavailable-like kCancelled once draining.
  Result<RequestHandle> Submit(EngineRequest request);
  // Cancels a request (no-op if it already ended); its stream gets a
  // kFinished event with cancelled set.
  void Cancel(RequestId id);
  // Forgets an agent's resident KV and its saves not yet handed to the KV
  // tier; the tier discards what it already has of the agent unless the
  // agent has a recorded history (KvTier::DiscardUnrecorded). Ordered
  // after the requests submitted and cancelled before it.
  void DropAgent(const std::string& agent_key);
  // Stops admitting new requests and waits until every queued and running
  // request has finished, or `timeout_s` seconds (< 0: no limit) have
  // passed; false on a timeout (requests still run; Stop ends them).
  bool Drain(double timeout_s = -1);
  // Cancels everything and joins the engine thread. The KV of running
  // agents' turns (prompt and output so far) is saved to the tiers first,
  // as at the end of a turn, so that a cut-off agent resumes from it.
  void Stop();
  // Stop()s and hands the backend back (to build another engine on it).
  std::unique_ptr<backend::Backend> ReleaseBackend();

  EngineStats Stats() const;
  // Leading tokens of `agent_key`'s KV kept resident after its last turn
  // (as of that turn's end; memory pressure may have evicted some since).
  // 0 for an unknown agent.
  int64_t AgentResidentTokens(const std::string& agent_key) const;
  const model::ModelConfig& config() const { return backend_->config(); }
  const cache::ModelCacheSpec& cache_spec() const { return backend_->cache_spec(); }
  int32_t max_context() const { return max_context_; }
  // The KV pool: blocks per cache group (as ModelCacheSpec::groups) and
  // their bytes.
  const std::vector<int32_t>& kv_blocks() const { return kv_blocks_; }
  uint64_t kv_memory_bytes() const { return kv_memory_bytes_; }
  // The most tokens (prompt and output) one request can hold: the context,
  // or less when the pool cannot hold that much for one sequence.
  int64_t sequence_capacity() const { return sequence_capacity_; }
  int block_size() const { return options_.block_size; }
  int max_step_tokens() const { return options_.scheduler.max_step_tokens; }

 private:
  Engine(std::unique_ptr<backend::Backend> backend, const text::Tokenizer* tokenizer,
         EngineOptions options);
  // The engine thread: one iteration per wake-up, as the phases below in
  // order, then Shutdown once stopping.
  void Loop();
  // What other threads queued since the last iteration.
  struct Inbox {
    std::deque<std::unique_ptr<Sequence>> submitted;
    std::vector<RequestId> cancelled;
    std::vector<std::string> dropped;
    bool restored = false;  // the loader has chunks for KvTransfer::TakeRestored
  };
  // Sleeps until there is work (polling each millisecond while saves or
  // restore copies are pending) and takes the inbox; nullopt once stopping.
  std::optional<Inbox> WaitForWork();
  // Sequences whose restores finished loading go (back) to the scheduler.
  void AdmitRestored(double now);
  // New requests go to KvTransfer::Admit (which may park them to restore
  // their KV first) and those ready to run to the scheduler; empties the
  // pointers of `submitted`.
  void AdmitSubmitted(std::deque<std::unique_ptr<Sequence>>& submitted, double now);
  // Ends each cancelled request still queued, running or parked with a
  // cancelled kFinished event (its blocks free before the next step).
  void ApplyCancellations(const std::vector<RequestId>& cancelled);
  // Forgets the named agents' resident KV.
  void DropAgents(const std::vector<std::string>& agents);
  // Joins loaded split restores, then plans, launches and collects one step
  // if anything runs and delivers its events; returns its seconds (0: none).
  double RunStep();
  // Tells Drain() the engine is idle when nothing is queued, running,
  // parked or being saved.
  void PublishIdle();
  // Stopping: collects the steps in flight, cancels everything, saves every
  // agent's KV and wakes Drain().
  void Shutdown();
  // Ends every queued, parked, waiting and running request as cancelled; a
  // running agent's KV so far is retired to it as at the end of a turn.
  void CancelEverything();
  void Step();
  // Times two prefill chunks (at the start of the context and deep into
  // it) on scratch blocks, before serving.
  PrefillCost CalibratePrefill();
  // Joins split restores whose tails are loaded to their heads.
  void AttachSplits();
  // Pipelined steps: what was launched, to handle its output later.
  struct LaunchedRow {
    RequestId id = 0;
    int64_t first = 0;  // the sequence's `computed` before the step
    int32_t num_tokens = 0;
    bool want_logits = false;
    bool backend_pick = false;  // kGreedy or kDevice: the backend picks
    // An optimistic pick of a constrained row (RowPick::keep_logits): the
    // grammar checks the backend's pick; a rejected one is picked again on
    // the host from the kept logits.
    bool kept = false;
    int64_t pick_at = 0;  // index of the pick's placeholder in tokens
    // Draft tokens after the first (tokens[first + 1, first + 1 + draft)),
    // each with its own logits row after the first's: committed to the KV
    // cache only once verified.
    int32_t draft = 0;
    // The sequence's generator before this row's draw (a kDevice row):
    // restored when the row is discarded, so the draw is made again.
    Sampler::RngState rng_before{};
    // Rolled back: the step before picked a token the grammar rejected, so
    // this row ran on the wrong token; its output and KV are ignored.
    bool discarded = false;
  };
  struct LaunchedStep {
    std::vector<LaunchedRow> rows;
    int picks = 0;            // logits rows (want_logits rows' LogitRows)
    std::span<float> logits;  // where its kHost and kept rows' logits go
  };
  // A constrained row of the step being collected was rejected while the
  // sequence's row of the next step is in flight: that row is discarded
  // and the sequence goes back to before it (its pick at `pick_at` still
  // to be filled in by the caller).
  void RollBack(Sequence* s, int64_t pick_at);
  // Whether this engine drafts at all (options and backend).
  bool speculation_on() const;
  // Fills Sequence::draft of the running sequences the next step may
  // draft for, within StepDraftBudget.
  void ProposeDrafts();
  // Whether the next step would admit a waiting request (and prefill it).
  bool AdmissionLikely() const;
  // Verifies a drafted row (logits rows from `first_row`) and emits its
  // tokens; true when the sequence finished.
  bool CollectDrafted(Sequence* s, const LaunchedRow& r, int first_row, std::span<float> logits);
  // Emits output token `tok` at tokens[at] (already in place): detokenize,
  // stop-check, event; true when the sequence finished (settled and
  // Finish()ed).
  bool EmitToken(Sequence* s, int32_t tok, int64_t at, const SampledToken* picked,
                 const backend::RowLogprobs* row_lp);
  // Collects the oldest launched step and handles its output.
  void CollectOldest();
  void CollectAll();
  // Tells the KV cache manager of the newest step's tokens (all known now).
  void CommitNewest();
  // A finished sequence back to its real tokens and committed KV.
  void Settle(Sequence* s, int64_t real_tokens);
  void Finish(Sequence* s, FinishReason reason, bool cancelled, std::string tail);
  void Fail(Sequence* s, const Status& error);
  void PublishStats();
  // Events wait in the outbox until Deliver, which publishes the stats first:
  // a client that has seen an event sees the engine state that follows it
  // (its request running after a token; its blocks released, its agent's
  // cache resident after the end).
  void Emit(Sequence* s, RequestOutput ev);
  void Deliver();
  double Now() const;

  std::unique_ptr<backend::Backend> backend_;
  const text::Tokenizer* tokenizer_;
  EngineOptions options_;
  int32_t max_context_ = 0;
  std::vector<int32_t> kv_blocks_;
  uint64_t kv_memory_bytes_ = 0;
  int64_t sequence_capacity_ = 0;
  std::unique_ptr<cache::KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  // KV movement: residency, the host tier, store restores and saves.
  std::unique_ptr<KvTransfer> transfer_;
  std::chrono::steady_clock::time_point start_;

  // Inbox, guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wakes Drain()
  std::deque<std::unique_ptr<Sequence>> submitted_;
  std::vector<RequestId> cancelled_;
  std::vector<std::string> dropped_agents_;
  bool transfer_ready_ = false;  // the loader has chunks for KvTransfer::TakeRestored
  // The last step found nothing to run while split restores were loading:
  // the engine thread sleeps until something arrives (engine thread only).
  bool waiting_on_loads_ = false;
  bool stopping_ = false;
  bool draining_ = false;
  bool idle_ = true;
  RequestId next_id_ = 1;
  EngineStats stats_;  // published copy

  // Engine-thread state.
  std::vector<backend::SeqStep> steps_buf_;
  std::vector<backend::RowPick> pick_buf_;
  std::vector<int32_t> picks_buf_;
  std::deque<LaunchedStep> launched_;  // oldest first
  // Logits rows of kHost rows and of kept rows read back (one per sequence
  // and draft token), in Backend::AllocateHostBuffer memory: pinned on a
  // GPU, so that the device-to-host copies of a step run at full speed and
  // asynchronously (into pageable memory a copy runs through the driver's
  // staging and the call returns only once it is done). Freed before the
  // backend (declared after it).
  backend::HostBuffer logits_buf_;
  std::span<float> logits_;
  // With kept_in_flight_, logits_ holds two sets of rows, for alternate
  // steps (the next launch must not overwrite rows the grammar may still
  // need): the set the next launch uses.
  std::span<float> step_logits_[2];
  int next_logits_ = 0;
  // Steps with kept rows pipeline (EngineOptions::pipeline_grammar, and
  // the backend reads kept rows while the next step runs).
  bool kept_in_flight_ = false;
  // kHost rows of the step being collected: their sequences and picks.
  std::vector<std::pair<int, Sequence*>> sample_rows_;
  std::vector<SampledToken> sample_picks_;
  // Per want_logits row of the step being collected: picked on the host
  // (kHost, or a kept row the grammar rejected).
  std::vector<uint8_t> host_picked_;
  std::vector<int32_t> kept_rows_;  // kept rows to read back (rejected picks)
  // Constrained rows are picked optimistically (EngineOptions::
  // UseOptimisticGrammar of optimistic_grammar and the backend).
  bool kept_logits_ = false;
  // optimistic_grammar not kOff: constrained rows picked on the host take
  // the optimistic procedure too (Sampler::SampleOptimistic).
  bool optimistic_procedure_ = false;
  std::unique_ptr<ThreadPool> sample_pool_;  // null: sample on the engine thread
  std::vector<std::pair<std::shared_ptr<TokenStream>, RequestOutput>> outbox_;
  EngineStats local_;
  std::thread thread_;
};

}  // namespace agentkv::engine
