// KvTransfer: KV movement between the device pool and the slower tiers, for
// one engine. It owns the resident agents (their pinned pool blocks), the
// host-memory tier (engine/host_kv_tier.h), the restore pipeline from the
// KV tier (the store: a loader thread decoding into pinned staging slots)
// and the save pipeline to it (finished turns' blocks read off the device
// into save staging and handed over write-behind).
//
// A returning request's prefix comes back in this order: blocks resident in
// the pool, then the host tier (asynchronous host-to-device copies from
// pinned memory, no decoding), then the store (parked while the loader
// decodes, a chunk at a time), and whatever is left is recomputed by prefill. For the store's
// part the loader first counts the stored blocks and plans with
// PlanRestore (engine/restore_policy.h): where recomputing a head of it
// while the rest loads is faster than loading it all, the request is
// scheduled at once with its prefill stopped at the end of the head
// (Sequence::prefill_limit), the rest is loaded into held pool blocks, and
// once both are done AttachSplit joins them. Right before the
// scheduler admits a sequence (the Scheduler's admit hook calls
// RestoreBeforeAdmit), blocks the pool evicted while it waited come back
// from the host tier again; so does a preempted sequence's KV: what the
// pool evicted of it went to the host tier (OnEvict), and it resumes
// without recomputing where the host tier had room.
//
// The engine drives it from the engine thread: Admit (schedule now or park),
// TakeRestored (apply loaded chunks; sequences ready to schedule),
// FlushEvictions (before any backend call that may overwrite blocks),
// RetireAgent / DropAgent, CompleteSaves, and at shutdown TakeParked,
// ReleaseAgents and DrainSaves. The loader thread talks back through an
// inbox and the `wake` callback.
//
// Restores write the pool with Backend::StartWriteBlocks and do not wait:
// the backend orders the copies before any later step or read of those
// blocks. Only their sources wait: host-tier slots stay leased (never
// evicted or overwritten) and restore slots stay away from the loader
// until the backend reports the copies done, which CompleteSaves polls
// (WritesPending says whether to keep polling). DrainSaves, ReleaseBuffers
// and the destructor wait for them.
//
// Thread-safety: every method runs on the engine thread except
// AgentResidentTokens and HasLoaded (any thread), and the loader thread's
// own work. The backend and the KV cache manager are touched only on the
// engine thread. Both must outlive this object; Stop() joins the loader.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "cache/kv_tier.h"
#include "engine/backend/backend.h"
#include "engine/host_kv_tier.h"
#include "engine/restore_policy.h"
#include "engine/sequence.h"
#include "engine/staging_pool.h"

namespace agentkv::engine {

struct KvTransferOptions {
  int block_size = 16;
  // The persistent tier, or null (EngineOptions::kv_tier).
  std::shared_ptr<cache::KvTier> kv_tier;
  size_t restore_chunk_bytes = 64ull << 20;
  size_t save_staging_bytes = 512ull << 20;
  // Host-memory tier size; 0: none. Where the host cannot give that much,
  // half of it, else none.
  uint64_t host_kv_bytes = 0;
  // Restore-or-recompute for the store's part of a prefix. False: load
  // everything the store has (no split).
  bool split_restores = true;
  // What the store delivers, in bytes of KV a second, until loads have
  // been timed (then their running rate is used).
  double tier_bytes_per_s = 1e9;
  // ... and its latency (before the first block of a load arrives).
  double tier_latency_s = 0.02;
};

// Counters for EngineStats (see there).
struct KvTransferStats {
  int64_t resident_agents = 0;
  int64_t loading = 0;
  // Restored tokens count when their copies into the pool are issued; a
  // copy failing later (its blocks are then dropped) also counts in
  // restore_problems.
  int64_t restored_tokens = 0;          // from the store
  int64_t host_restored_tokens = 0;     // from the host tier (admissions and re-admissions)
  int64_t split_restores = 0;           // store restores split with a recompute
  int64_t split_recomputed_tokens = 0;  // their recomputed heads
  int64_t recomputed_restores = 0;      // the store had it; recomputing all was faster
  double host_write_seconds = 0;        // issuing host tier -> pool copies
  double tier_bytes_per_s = 0;          // the store's measured rate (0: not yet)
  double tier_latency_s = 0;            // and latency (the prior until measured)
  int64_t restore_problems = 0;
  int64_t saved_blocks = 0;
  int64_t save_dropped_blocks = 0;
  double restore_load_seconds = 0;
  // Copies into the pool are asynchronous (a step issued later runs after
  // them on the device). restore_write_seconds is the engine thread's time
  // issuing them, from both tiers (host_write_seconds is the host tier's
  // part of it). The *_done_seconds sum, per host-tier restore
  // (host_write_) or store chunk (restore_write_), the time from the first
  // issue until the engine saw the copies done: it includes the issue and
  // is late by up to one engine loop iteration (completion is polled); it
  // is the time to divide the bytes by for a rate.
  double restore_write_seconds = 0;
  double restore_write_done_seconds = 0;
  double host_write_done_seconds = 0;
  double save_seconds = 0;
  HostKvTierStats host;
};

class KvTransfer {
 public:
  // Allocates staging (and the host tier) now and starts the loader when
  // there is a KV tier. Without prefix caching there is nothing to restore
  // into: the tiers are dropped. `wake` is called (from the loader thread)
  // when loaded chunks wait for TakeRestored.
  static Result<std::unique_ptr<KvTransfer>> Create(backend::Backend* backend,
                                                    cache::KvCacheManager* kv,
                                                    KvTransferOptions options,
                                                    std::function<void()> wake);
  ~KvTransfer();  // Stop()s
  KvTransfer(const KvTransfer&) = delete;
  KvTransfer& operator=(const KvTransfer&) = delete;

  // Stops and joins the loader (loads in progress end as cancelled chunks).
  void Stop();
  // Stop()s and frees host memory (staging, the host tier) through the
  // backend's allocator, before the backend goes elsewhere. Only residency
  // queries (AgentResidentTokens) and Stats remain usable.
  void ReleaseBuffers();

  // A new request: brings back what the pool lacks of its prompt from the
  // host tier now, then parks it (returns null) while the store loads the
  // rest, or returns it to be scheduled at once. `busy` (>= 1) is how
  // loaded the device is (RestoreRates::gpu_busy_factor).
  std::unique_ptr<Sequence> Admit(std::unique_ptr<Sequence> s, double busy = 1);
  // What prefill costs on this device (the engine measures it); unknown:
  // never split.
  void SetPrefillCost(PrefillCost cost) { prefill_cost_ = cost; }

  // Split restores. Requests whose tail load is over (done, stopped early
  // or failed), to be joined by AttachSplit.
  std::vector<RequestId> LoadedSplits() const;
  // Joins a loaded split once `s` is running and its prefill reached its
  // limit: the loaded tail is attached after its head, its blocks are
  // released and the limit cleared. False (nothing changes) before that:
  // the tail stays held while `s` waits or computes its head.
  bool AttachSplit(Sequence* s);
  // Forgets a split of a request that went away (its load stops early).
  void CancelSplit(RequestId id);
  size_t splits() const { return splits_.size(); }
  // Splits whose tail is still loading.
  size_t splits_loading() const;
  // Applies the chunks the loader finished; returns the requests whose
  // restore is complete, to be scheduled.
  std::vector<std::unique_ptr<Sequence>> TakeRestored();
  // A parked request, removed (its load stops early); null if not parked.
  std::unique_ptr<Sequence> CancelParked(RequestId id);
  // Every parked request (shutdown).
  std::vector<std::unique_ptr<Sequence>> TakeParked();
  size_t parked() const { return loading_.size(); }

  // Before the scheduler admits a sequence (a preempted one, or one that
  // waited after Admit): its blocks that the pool evicted and the host tier
  // holds go back into the pool.
  void RestoreBeforeAdmit(Sequence* s);

  // Issues the device reads of blocks the pool evicted since the last call
  // into their host-tier slots. Call before any backend call that may write
  // blocks (a step, block copies, a restore): reads are ordered before it.
  void FlushEvictions();

  // A finished turn of an agent: pins its blocks as the agent's resident
  // cache (releasing the previous turn's) and saves what is new to the tier.
  void RetireAgent(Sequence* s);
  // Forgets an agent's resident cache, and its saves not yet handed to the
  // tier: none of them reaches the tier (or the host tier) afterwards.
  void DropAgent(const std::string& agent_key);
  // Unpins every resident agent (shutdown).
  void ReleaseAgents();
  // Frees the sources of finished restore copies, hands finished save
  // reads to the tier, commits finished host-tier reads (with `wait`, all
  // of them), then stages the save backlog.
  void CompleteSaves(bool wait);
  bool SavesPending() const { return !pending_saves_.empty() || !save_backlog_.empty(); }
  // Whether restore copies into the pool are still in flight (their host
  // sources held): CompleteSaves frees them once done.
  bool WritesPending() const { return !pending_writes_.empty(); }
  // Whether device reads into the host tier are still in flight.
  bool HostReadsPending() const { return !host_reads_.empty(); }
  // Shutdown: hands every turn's KV over (a tier that holds staging for 30
  // seconds without progress loses the rest) and waits for restore copies.
  void DrainSaves();

  // Any thread.
  int64_t AgentResidentTokens(const std::string& agent_key) const;
  bool HasLoaded() const;

  KvTransferStats Stats() const;
  const HostKvTier* host_tier() const { return host_.get(); }

 private:
  KvTransfer(backend::Backend* backend, cache::KvCacheManager* kv, KvTransferOptions options,
             std::function<void()> wake);
  Status Init();

  // Host tier.
  // Restores the host tier's run of blocks continuing `s`'s cached prefix
  // (at most up to block `usable_blocks`); returns blocks written.
  int32_t RestoreFromHost(Sequence* s, int64_t usable_blocks);
  void OnEvict(int32_t block, const cache::BlockHash& hash, const cache::BlockHash& parent,
               std::span<const int32_t> tokens);
  void CommitHostReads(bool wait);

  // Store restores: loads run on loader_ (never on the engine thread); their
  // results come back through the inbox and are written into the pool here.
  struct LoadJob {
    RequestId id = 0;
    std::vector<int32_t> tokens;
    cache::BlockHash root;  // the chain's start (Sequence::cache_root)
    int32_t first_block = 0;
    int32_t max_blocks = 0;
    // Plan a split first (the loader counts what the store has).
    bool plan = false;
    RestoreRates rates;
  };
  // One staging slot's worth of a load, from the loader to the engine
  // thread. `last` ends the load (done, stopped early or cancelled).
  struct LoadChunk {
    RequestId id = 0;
    int32_t first_block = 0;  // of the request's tokens
    int32_t blocks = 0;       // decoded into restore_slots_[slot]
    int slot = -1;            // -1: none (cancelled or stopping)
    Status problem;           // why the load stopped early, if it did
    bool last = false;
    double load_seconds = 0;
    // >= 0: no data, a split plan: recompute this many blocks before
    // first_block; the load continues from first_block (unless last).
    int32_t head_blocks = -1;
    // The first data chunk of a load: seconds since the loader took the
    // job (the tier's latency plus this chunk's transfer). -1 otherwise.
    double since_job_start = -1;
  };
  static constexpr int kRestoreSlots = 3;
  // Loader thread: a free slot, or -1 once stopping or the load `id` is
  // cancelled.
  int AcquireSlot(RequestId id);
  void LoaderLoop();
  // Applies one chunk; the request if its load is over.
  std::unique_ptr<Sequence> ApplyChunk(LoadChunk c);
  // The loader's planning step for a job: true when the job is over (the
  // plan recomputes everything); else the range to load is narrowed.
  bool PlanSplit(LoadJob* job, int32_t* next, int32_t* end);
  // A plan chunk: releases the parked request with its prefill limit.
  std::unique_ptr<Sequence> StartSplit(const LoadChunk& c);
  // Copies into the pool from one host source (a run of host-tier hits, or
  // a restore slot), issued and not known done; the source is held until
  // the backend reports `ticket` (the last one issued from it) done.
  struct PendingWrite {
    bool any = false;  // a copy was issued (else nothing to wait for)
    uint64_t ticket = 0;
    std::vector<HostKvTier::Hit> hits;  // host-tier leases, released when done
    int slot = -1;                      // a restore slot, returned when done
    std::chrono::steady_clock::time_point issued;
  };
  // Holds `w`'s source until its copies are done (at once if they are).
  void HoldUntilWritten(PendingWrite w);
  // Frees the sources of finished copies, oldest first; with `wait`, of
  // every one.
  void CompleteWrites(bool wait);
  // A data chunk of a split: written into held blocks.
  void ApplySplitChunk(const LoadChunk& c, PendingWrite* w);
  // Starts writing loaded blocks from a restore slot (from block `first`
  // of it) into pool blocks `ids`; the ticket goes to `w`.
  Status WriteChunk(const LoadChunk& c, size_t first, std::span<const int32_t> ids,
                    PendingWrite* w);
  void NoteLoadRate(const LoadChunk& c);
  // Gives a chunk's restore slot back to the loader once `w`'s copies from
  // it are done.
  void ReturnSlot(const LoadChunk& c, PendingWrite w);
  void FreeSlot(int slot);
  // Evicts every idle cached block of the group without keeping copies
  // (after a failed write left registered blocks holding garbage).
  void DropIdleBlocks();

  // Saves: a turn's blocks on their way to the tier, in chain order. Blocks
  // the tier lacks are read (found by hash in the prefix cache, so a block
  // evicted meanwhile is never read as something else) into save staging,
  // as many as there are free chunks; the rest wait for chunks to come back.
  struct SaveJob {
    std::string agent_key;
    uint32_t first_index = 0;                // chain index of blocks[0]
    cache::BlockHash parent;                 // chain hash before blocks[0]
    std::vector<cache::KvTierBlock> blocks;  // data filled as they are staged
    std::vector<uint8_t> need_data;          // per block: the tier lacks it
    size_t next = 0;                         // blocks before it are staged
  };
  // A staged run of a job, handed to the tier once the backend reports its
  // reads done.
  struct PendingSave {
    uint64_t ticket = 0;
    std::string agent_key;
    uint32_t first_index = 0;
    cache::BlockHash parent;                 // chain hash before blocks[0]
    std::vector<cache::KvTierBlock> blocks;  // data: slices of staging chunks
    // The agent was dropped: its reads still finish (the staging is in
    // use until then), but nothing goes to the tiers.
    bool dropped = false;
  };
  void SaveAgentKv(Sequence* s);
  // Reads `job`'s blocks that the host tier lacks from the device straight
  // into host-tier slots (committed once the reads are done).
  void KeepInHostTier(const SaveJob& job);
  void PumpSaves();

  backend::Backend* backend_;
  cache::KvCacheManager* kv_;
  KvTransferOptions options_;
  std::function<void()> wake_;
  int group_ = -1;          // the prefix group
  size_t block_bytes_ = 0;  // one block of it
  int32_t restore_slot_blocks_ = 0;

  // Loader inbox and outbox, guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable loader_cv_;
  bool stopping_ = false;
  std::deque<LoadJob> load_jobs_;
  std::deque<LoadChunk> loaded_;
  std::vector<int> free_slots_;                              // of restore_slots_
  std::unordered_set<RequestId> load_cancelled_;             // loads to stop early
  std::unordered_map<std::string, int64_t> agent_resident_;  // published copy
  // Set before the loader starts, then read-only (the loader reads them).
  std::vector<backend::HostBuffer> restore_slots_;
  std::thread loader_;

  // Engine-thread state.
  struct ResidentAgent {
    cache::AgentCache cache;
    // Hashes of the agent's chain blocks handed to the tier, in order.
    std::vector<cache::BlockHash> saved;
  };
  std::unordered_map<std::string, ResidentAgent> agents_;
  // Requests whose store load is in flight.
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> loading_;
  // Split restores under way (their requests are in the scheduler).
  struct Split {
    std::vector<int32_t> tokens;  // the prompt's whole blocks to restore into
    cache::BlockHash root;        // their chain's start (Sequence::cache_root)
    bool loaded = false;          // the tail's load is over
    bool broken = false;          // a chunk failed: the rest is not joined
    int64_t restored_tokens = 0;  // written from the store
  };
  std::unordered_map<RequestId, Split> splits_;
  PrefillCost prefill_cost_;
  double load_bytes_ = 0, load_seconds_ = 0;  // timed store loads, decayed
  double load_latency_s_ = 0;                 // the tier's, decayed (set in Init)
  // The rates a plan for `s` uses now (prefix_blocks left to the caller).
  RestoreRates PlanRates(int64_t cached_blocks, double busy) const;
  // Blocks this engine knows the tier has (saved or restored): later saves
  // of them only link the agent's chain. Cleared when it grows too large.
  std::unordered_set<cache::BlockHash, cache::BlockHashHasher> tier_has_;
  std::shared_ptr<StagingPool> save_staging_;
  std::deque<SaveJob> save_backlog_;
  std::deque<PendingSave> pending_saves_;

  std::unique_ptr<HostKvTier> host_;
  // Pool blocks evicted since the last FlushEvictions whose bytes go to
  // these reserved host-tier slots.
  struct Evicted {
    int32_t block;
    cache::BlockHash hash;
    HostKvTier::Slot slot;
  };
  std::vector<Evicted> evicted_;
  // Device reads into host-tier slots, oldest first; committed once done.
  struct HostRead {
    uint64_t ticket = 0;
    std::vector<cache::BlockHash> hashes;
  };
  std::deque<HostRead> host_reads_;
  std::deque<PendingWrite> pending_writes_;  // oldest first
  bool capture_evictions_ = true;

  KvTransferStats stats_;
};

}  // namespace agentkv::engine
