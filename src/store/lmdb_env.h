// LmdbEnv: the store's one LMDB environment, its named sub-databases, RAII
// transactions and map growth.
//
// Thread-safety: all methods may be called from any thread. Read
// transactions are not tied to threads (MDB_NOTLS) but one transaction is
// used by one thread at a time; the memory a Get returns stays valid (and
// may be read by other threads) until that transaction ends. Write() calls
// are serialized by LMDB. A thread must not hold a ReadTxn while it calls
// Write(): growing the map waits for every open transaction to end.
//
// Ownership: Open() returns the only handle; destroying it closes the
// environment. Never share an environment across fork(): open it in the
// process that uses it.
#pragma once

#include <lmdb.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv::store {

// The single mapping from LMDB (and errno) return codes to Status:
// map/disk full and quota are ResourceExhausted, LMDB's structural errors
// Corruption, everything else IoError.
Status LmdbStatus(int rc, std::string_view context);

enum class Db : int { kMeta, kAgents, kHistory, kChains, kKv, kKvMeta, kModels, kCount };
inline constexpr int kDbCount = static_cast<int>(Db::kCount);
const char* DbName(Db db);

struct LmdbOptions {
  uint64_t initial_map_bytes = 64ull << 20;
  uint64_t max_map_bytes = 1ull << 40;
  bool read_only = false;
  // false: commits do not fsync (MDB_NOSYNC). Only for tests and scratch
  // stores; a kill -9 still loses nothing, a power cut may.
  bool sync = true;
  // Take store.lock exclusively (compaction) instead of shared.
  bool exclusive = false;
};

class LmdbEnv {
 public:
  class ReadTxn;
  class WriteTxn;
  // Visits (key, value); return false from the visitor to stop.
  using Visitor = std::function<Result<bool>(std::string_view key, std::string_view value)>;

  // Creates DIR (unless read-only) and opens or creates the environment.
  static Result<std::unique_ptr<LmdbEnv>> Open(const std::string& dir, const LmdbOptions& options);
  ~LmdbEnv();
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;

  Result<ReadTxn> BeginRead();
  // Runs `fn` inside one write transaction and commits it (durable when
  // options.sync). On MDB_MAP_FULL the map is doubled (up to max_map_bytes)
  // and `fn` runs again from scratch, so it must have no effects outside
  // the transaction that a rerun would duplicate. An error from `fn` aborts.
  // Background writes (KV write-behind and its eviction) give way to the
  // others (history, metadata): one starts only when no other writer is
  // waiting or running, so a turn's durable history commit waits for at
  // most the one background transaction already under way. (LMDB's writer
  // lock is not fair: a busy background writer could take it again and
  // again ahead of a waiting commit.)
  Status Write(const std::function<Status(WriteTxn&)>& fn) { return WriteAs(fn, false); }
  Status WriteBackground(const std::function<Status(WriteTxn&)>& fn) { return WriteAs(fn, true); }
  // Background writes that waited for foreground ones.
  uint64_t background_yields() const { return background_yields_.load(); }
  // Foreground writers waiting or running now (a snapshot).
  int foreground_writers() const {
    std::lock_guard<std::mutex> gate(gate_mu_);
    return foreground_;
  }

  // Writes a compacted copy of the environment into the empty directory
  // `dir` (mdb_env_copy2 with MDB_CP_COMPACT).
  Status CopyCompact(const std::string& dir);

  uint64_t map_size() const { return map_size_.load(); }
  const std::string& dir() const { return dir_; }
  const LmdbOptions& options() const { return options_; }
  MDB_dbi dbi(Db db) const { return dbis_[static_cast<int>(db)]; }

 private:
  LmdbEnv() = default;
  // Grows the map after a MAP_FULL seen at `seen_size`; ResourceExhausted at the maximum.
  Status Grow(uint64_t seen_size);
  // Adopts a map size another process set (MDB_MAP_RESIZED).
  Status AdoptMapSize();
  Status WriteAs(const std::function<Status(WriteTxn&)>& fn, bool background);

  MDB_env* env_ = nullptr;
  std::array<MDB_dbi, kDbCount> dbis_{};
  std::string dir_;
  LmdbOptions options_;
  int lock_fd_ = -1;
  std::atomic<uint64_t> map_size_{0};
  // Shared by every transaction, exclusive while the map is resized.
  std::shared_mutex resize_mu_;
  // Foreground writers waiting or running; background writers wait for 0.
  mutable std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  int foreground_ = 0;
  std::atomic<uint64_t> background_yields_{0};
};

// Operations common to read and write transactions.
class LmdbTxnBase {
 public:
  // The value for `key`, nullopt if absent. The view lives as long as the
  // transaction (and until the next write in a write transaction).
  Result<std::optional<std::string_view>> Get(Db db, std::string_view key) const;
  // Visits keys starting with `prefix` in order, from the first key at or
  // after `from` (which must start with `prefix`) when it is given.
  Status Scan(Db db, std::string_view prefix, const LmdbEnv::Visitor& visit,
              std::string_view from = {}) const;
  // Entries in `db`.
  Result<uint64_t> Count(Db db) const;
  // Bytes of pages every sub-database uses (excluding free pages).
  Result<uint64_t> UsedBytes() const;
  MDB_txn* raw() const { return txn_; }

 protected:
  LmdbTxnBase(LmdbEnv* env, MDB_txn* txn) : env_(env), txn_(txn) {}
  LmdbEnv* env_;
  MDB_txn* txn_;
};

// A read-only snapshot; aborted when destroyed. Movable.
class LmdbEnv::ReadTxn : public LmdbTxnBase {
 public:
  ReadTxn(ReadTxn&& o) noexcept;
  ReadTxn& operator=(ReadTxn&&) = delete;
  ~ReadTxn();

 private:
  friend class LmdbEnv;
  ReadTxn(LmdbEnv* env, MDB_txn* txn, std::shared_lock<std::shared_mutex> lock)
      : LmdbTxnBase(env, txn), lock_(std::move(lock)) {}
  std::shared_lock<std::shared_mutex> lock_;
};

// Handed to the function given to LmdbEnv::Write().
class LmdbEnv::WriteTxn : public LmdbTxnBase {
 public:
  Status Put(Db db, std::string_view key, std::string_view value);
  // Deleting a missing key is OK; returns whether it existed.
  Result<bool> Del(Db db, std::string_view key);

 private:
  friend class LmdbEnv;
  WriteTxn(LmdbEnv* env, MDB_txn* txn) : LmdbTxnBase(env, txn) {}
  bool map_full_ = false;
};

}  // namespace agentkv::store
