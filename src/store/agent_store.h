// AgentStore: the persistent agent store (SPEC section 5). Agents' metadata
// and history, per-agent KV chains, content-addressed KV blocks and model
// fingerprints in one LMDB environment (docs/store-format.md). As a
// HistoryStore it is the durable one: it never drops history.
//
// Durability: AppendTurn, PutAgentExtras, PutModel and RemoveAgent commit
// and fsync before they return OK. KV writes are write-behind: PutKvBlocks
// only enqueues; one writer thread compresses and group-commits; Flush()
// waits for what was queued before it.
//
// Removal wins over write-behind: RemoveAgent tombstones the id first, and a
// KV write for a tombstoned agent (queued before the removal or handed over
// after it by a save that was still in flight) is dropped whole, chain and
// blocks, since a block's tokens are the agent's conversation. The
// tombstone lasts until AppendTurn creates the agent again (the newest
// kMaxTombstones removals are remembered).
//
// Correctness of served KV: a block is only returned under the fingerprint
// and chain hash it was written with, after its checksum, sizes and zstd
// checksum pass. A record that fails is reported (Corruption naming its key)
// and the prefix stops before it.
//
// Thread-safety: every method may be called from any thread. The store
// knows nothing of its callers' threads; PutKvBlocks never does I/O.
// Ownership: the destructor flushes pending KV writes and closes the
// environment. Only one AgentStore per directory per process; never carry
// one across fork().
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cache/block_hash.h"
#include "store/fingerprint.h"
#include "store/group_committer.h"
#include "store/history_store.h"
#include "store/kv_write_queue.h"
#include "store/lmdb_env.h"
#include "store/records.h"
#include "util/status.h"

namespace agentkv::store {

class WorkerPool;

struct StoreOptions {
  uint64_t initial_map_bytes = 64ull << 20;
  // The map doubles on MDB_MAP_FULL up to this; past it writes fail with
  // ResourceExhausted.
  uint64_t max_map_bytes = 1ull << 40;
  // --store-max-bytes: 0 = unlimited; otherwise least-recently-used KV
  // blocks are evicted after KV writes to keep used pages under it.
  uint64_t max_bytes = 0;
  size_t kv_queue_max_bytes = 512ull << 20;
  size_t kv_batch_max_bytes = 32ull << 20;  // per group commit
  int compression_level = 1;
  int worker_threads = 4;  // compression and decompression helpers
  // Nice of the KV write-behind's compression helpers (the writer thread
  // itself keeps normal priority: it holds the LMDB write lock that history
  // appends wait for).
  int write_nice = 10;
  uint64_t max_block_bytes = 64ull << 20;  // bound on one block's size
  bool sync = true;                        // false: no fsync (tests, scratch stores)
  bool read_only = false;                  // inspection (ls/show/verify) beside a server
  // Milliseconds since the epoch; tests inject a fake clock.
  std::function<int64_t()> clock;
};

struct KvBlock {
  cache::BlockHash hash;
  std::vector<int32_t> tokens;
  std::string data;  // decompressed KV bytes
};

struct KvPrefix {
  std::vector<KvBlock> blocks;  // the longest usable prefix, in order
  // OK, or Corruption naming the record that ended the prefix.
  Status problem;
};

class KvBlockCodec;
struct KvBlockView;

// What LoadKvPrefixInto wrote.
struct KvPrefixInto {
  size_t blocks = 0;  // the longest usable prefix, written in order
  Status problem;     // as KvPrefix::problem
};

struct KvFingerprintUsage {
  ModelFingerprint fp;
  uint64_t chain_blocks = 0;   // entries in the agent's chain
  uint64_t stored_blocks = 0;  // of those, blocks present on disk
  uint64_t stored_bytes = 0;   // their compressed record bytes
};

struct AgentSummary {
  AgentMeta meta;
  std::vector<KvFingerprintUsage> kv;
};

struct KvStoreStats {
  KvWriteQueue::Stats queue;
  uint64_t blocks_written = 0;
  uint64_t bytes_written = 0;  // compressed record bytes
  uint64_t blocks_evicted = 0;
  uint64_t write_errors = 0;
  uint64_t tombstoned_writes = 0;  // KV writes of removed agents, dropped
};

struct VerifyReport {
  uint64_t records = 0;
  uint64_t kv_blocks = 0;
  uint64_t kv_uncompressed_bytes = 0;
  uint64_t kv_stored_bytes = 0;
  std::vector<std::string> problems;  // one line per corrupt record
  bool ok() const { return problems.empty(); }
};

class AgentStore : public HistoryStore {
 public:
  static Result<std::unique_ptr<AgentStore>> Open(const std::string& dir,
                                                  StoreOptions options = {});
  ~AgentStore() override;
  AgentStore(const AgentStore&) = delete;
  AgentStore& operator=(const AgentStore&) = delete;

  // --- agents and history (synchronous, durable on OK) -------------------
  // Appends one turn (the messages as JSON text) to `agent_id`'s history,
  // creating the agent on its first turn; returns the turn number.
  // `system_prompt_hash` is recorded when the agent is created.
  Result<uint32_t> AppendTurn(std::string_view agent_id, std::string_view messages_json,
                              std::string_view system_prompt_hash = {}) override;
  // Replaces the agent's caller-owned extras object.
  Status PutAgentExtras(std::string_view agent_id, const nlohmann::json& extras);
  Result<AgentMeta> GetAgent(std::string_view agent_id) override;
  Result<std::vector<AgentMeta>> ListAgents() override;
  // At most `limit` agents whose id starts with `prefix` and sorts after
  // `after` (byte order; "": from the first), in order.
  Result<std::vector<AgentMeta>> ListAgents(std::string_view after, size_t limit,
                                            std::string_view prefix = {}) override;
  Result<std::vector<Turn>> GetHistory(std::string_view agent_id) override;
  // History, meta, chains and the KV blocks no other chain refers to.
  // Tombstones the id (see above), then waits for the KV writes queued
  // before it, so none of the agent's KV is written after it returns.
  Status RemoveAgent(std::string_view agent_id) override;
  // Whether KV writes for `agent_id` are being dropped (removed, not
  // created again since).
  bool IsTombstoned(std::string_view agent_id) const;
  static constexpr size_t kMaxTombstones = 16384;
  Result<AgentSummary> Summarize(std::string_view agent_id);

  // --- models ---------------------------------------------------------------
  Status PutModel(const ModelFingerprint& fp, std::string_view description_json);
  Result<std::string> GetModel(const ModelFingerprint& fp);

  // --- KV (write-behind) ----------------------------------------------------
  // Enqueues; returns at once. Dropped (and counted) under queue pressure.
  void PutKvBlocks(KvChainWrite write);
  // Waits until every KV write queued before the call is committed or
  // dropped; returns the first write error since the previous Flush.
  Status Flush();
  // Longest stored prefix of `hashes` under `fp`. When `tokens` is given
  // (the request's tokens, block i = tokens[i*bs, (i+1)*bs)), each block's
  // stored tokens must equal them too. Decompresses on the worker pool.
  // Fails only on I/O errors; corruption ends the prefix (see KvPrefix).
  Result<KvPrefix> LoadKvPrefix(const ModelFingerprint& fp,
                                std::span<const cache::BlockHash> hashes,
                                std::span<const int32_t> tokens = {}, int block_size = 0);
  // Same, decompressing block i straight into dst[i * block_bytes, +block_bytes)
  // (at most dst.size() / block_bytes blocks); a stored block of another
  // size ends the prefix as corruption. On return, bytes of blocks past the
  // usable prefix are unspecified.
  Result<KvPrefixInto> LoadKvPrefixInto(const ModelFingerprint& fp,
                                        std::span<const cache::BlockHash> hashes,
                                        std::span<const int32_t> tokens, int block_size,
                                        std::span<std::byte> dst, size_t block_bytes);
  // How many of `hashes` have a stored record, from the first up to the
  // first missing one; reads no record (a corrupt one still counts).
  Result<size_t> CountKvPrefix(const ModelFingerprint& fp,
                               std::span<const cache::BlockHash> hashes);
  // Same as LoadKvPrefix, hashing the full blocks of `tokens` with cache/block_hash.h
  // (the unsalted chain: a salted request's blocks are not found).
  Result<KvPrefix> LoadKvPrefixForTokens(const ModelFingerprint& fp,
                                         std::span<const int32_t> tokens, int block_size);
  // The agent's chain under `fp` from block 0 up to the first gap.
  Result<std::vector<ChainEntry>> GetKvChain(std::string_view agent_id,
                                             const ModelFingerprint& fp) override;
  KvStoreStats kv_stats() const;
  // History appends: requests, shared transactions, time callers waited.
  GroupCommitter::Stats history_stats() const { return committer_->stats(); }
  // KV write transactions that waited for a history commit (LmdbEnv).
  uint64_t kv_write_yields() const;

  // --- maintenance ------------------------------------------------------------
  // Checks every record (envelope, structure, KV decompression).
  Result<VerifyReport> Verify();
  // Pages in use by all sub-databases.
  Result<uint64_t> UsedBytes();
  // Evicts least-recently-used KV blocks until used pages are at most
  // `target_bytes` or no stored block is left; returns blocks evicted.
  Result<uint64_t> EvictKvTo(uint64_t target_bytes);
  // Rewrites DIR's data file compactly (mdb_env_copy2 + MDB_CP_COMPACT) and
  // swaps it in. No process may have the store open (checked by lock).
  static Status Compact(const std::string& dir);

  // The raw environment, for tools and tests that need to reach past the
  // record layer (e.g. to corrupt a record on purpose).
  LmdbEnv& env() { return *env_; }
  const StoreOptions& options() const { return options_; }

 private:
  AgentStore() = default;
  int64_t Now() const;
  void WriterLoop();
  Status WriteBatch(std::vector<KvChainWrite>& batch);
  // The shared part of the two LoadKvPrefix forms: looks up the stored
  // prefix of `hashes`, then checks each record and calls `decode(i, view,
  // codec)` on the worker pool; returns how many blocks in a row succeeded
  // and why the next did not. Refreshes the LRU time of the good blocks.
  using DecodeFn = std::function<Status(size_t i, const KvBlockView& view, KvBlockCodec& codec,
                                        const std::string& where)>;
  Result<KvPrefixInto> LoadPrefix(const ModelFingerprint& fp,
                                  std::span<const cache::BlockHash> hashes,
                                  std::span<const int32_t> tokens, int block_size,
                                  size_t max_blocks, const DecodeFn& decode);
  void RecordWriteError(const Status& s);
  void AddTombstone(std::string_view agent_id);
  void ClearTombstone(std::string_view agent_id);
  // Evicts at least `bytes` of stored KV (by record size), oldest access
  // first, inside `txn`; returns blocks evicted.
  Result<uint64_t> EvictInTxn(LmdbEnv::WriteTxn& txn, uint64_t bytes);
  // The same in a transaction of its own; counts evictions.
  Result<uint64_t> EvictLru(uint64_t bytes);

  std::unique_ptr<LmdbEnv> env_;
  StoreOptions options_;
  std::unique_ptr<GroupCommitter> committer_;  // history appends
  std::unique_ptr<WorkerPool> pool_;           // resume decompression, verify
  std::unique_ptr<WorkerPool> write_pool_;     // write-behind compression (low priority)
  std::unique_ptr<KvWriteQueue> queue_;
  std::thread writer_;
  mutable std::mutex err_mu_;
  Status first_error_;
  // Removed agents whose KV writes are dropped; oldest first in order.
  mutable std::mutex tomb_mu_;
  std::unordered_set<std::string> tombstones_;
  std::deque<std::string> tomb_order_;
  std::atomic<uint64_t> tombstoned_writes_{0};
  std::atomic<uint64_t> blocks_written_{0}, bytes_written_{0}, blocks_evicted_{0}, write_errors_{0};
};

}  // namespace agentkv::store
