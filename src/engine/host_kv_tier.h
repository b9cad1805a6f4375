// HostKvTier: whole KV blocks of the prefix cache group kept in host memory
// between the device pool and the store, so that a block the pool lets go of
// (evicted, or a preempted sequence's) comes back with one host-to-device
// copy instead of a decode from the store or a recompute.
//
// Memory: a few large arenas from Backend::AllocateHostBuffer (pinned on a
// GPU, so copies to and from the device run by DMA and asynchronously),
// carved into equal block slots once; nothing is allocated per block. The
// byte bound is the arenas' size.
//
// Addressing: by the chained BlockHash (cache/block_hash.h), exactly as the
// prefix cache and the store address blocks, so a block is only ever found
// for the token prefix it was computed from; the block's parent hash and
// tokens are kept and compared on every lookup, as the prefix cache does.
//
// Binding: a tier is built for one backend (one model, one KV format and
// block size) and dies with the engine that owns it: a model swap builds a
// new engine and so an empty tier. It never serves a block under another
// fingerprint because it never outlives the model that wrote it.
//
// Filling: a slot is reserved (Reserve) and its bytes are written by the
// caller, usually by an asynchronous device read; it is not served until
// Commit. Abort gives the slot back. Eviction is LRU over committed,
// unleased entries; reserved and leased ones are never evicted (their bytes
// are being written or read).
//
// Thread-safety: none; the engine thread owns it. Slot bytes may be written
// by the device meanwhile (between Reserve and Commit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"
#include "engine/backend/backend.h"
#include "util/status.h"

namespace agentkv::engine {

struct HostKvTierOptions {
  size_t capacity_bytes = 0;          // the bound; rounded down to whole blocks
  size_t block_bytes = 0;             // one block of the prefix group
  int block_size = 16;                // tokens per block
  size_t arena_bytes = 256ull << 20;  // largest single host allocation
};

struct HostKvTierStats {
  int64_t capacity_bytes = 0;
  int64_t bytes = 0;   // held by committed blocks
  int64_t blocks = 0;  // committed blocks
  int64_t hits = 0;    // blocks handed out by Match
  int64_t inserts = 0;
  int64_t evictions = 0;
};

class HostKvTier {
 public:
  // A slot's bytes (block_bytes of them).
  using Slot = std::span<std::byte>;

  // Allocates every arena now (call outside hot paths). InvalidArgument when
  // the capacity holds no block; ResourceExhausted when host memory is short.
  static Result<std::unique_ptr<HostKvTier>> Create(backend::Backend& backend,
                                                    HostKvTierOptions options);
  HostKvTier(const HostKvTier&) = delete;
  HostKvTier& operator=(const HostKvTier&) = delete;

  size_t block_bytes() const { return options_.block_bytes; }
  int block_size() const { return options_.block_size; }
  int32_t capacity_blocks() const { return num_slots_; }

  // Whether a committed block is held under `hash` (no LRU change).
  bool Contains(const cache::BlockHash& hash) const;
  // Marks a held block most recently used; false if there is none.
  bool Touch(const cache::BlockHash& hash);

  // A slot for the block `hash` (holding `tokens`, block_size of them, after
  // a block hashed `parent`), evicting the least recently used entry if
  // needed. Empty if the hash is held or reserved already, or if every slot
  // is reserved or leased. The entry is served only after Commit(hash).
  Slot Reserve(const cache::BlockHash& parent, const cache::BlockHash& hash,
               std::span<const int32_t> tokens);
  // The reserved slot's bytes are in place: the block is served from now on.
  void Commit(const cache::BlockHash& hash);
  // Gives a reserved slot back (its bytes never arrived).
  void Abort(const cache::BlockHash& hash);
  // Reserve + copy + Commit. False if nothing was stored (already held, or
  // no free slot).
  bool Insert(const cache::BlockHash& parent, const cache::BlockHash& hash,
              std::span<const int32_t> tokens, std::span<const std::byte> data);

  // The committed blocks continuing full block `first_block` of `tokens`
  // (chained hashes from the start of `tokens`), at most `max_blocks`, in
  // order; each is leased (never evicted or overwritten) until Release. The
  // chain hash of block first_block - 1 is `parent` (kRootBlockHash for 0).
  // `pending` (if given) is set when the run stopped at a block that is
  // reserved and not committed yet (its bytes are still on their way).
  struct Hit {
    cache::BlockHash hash;
    std::span<const std::byte> data;
  };
  std::vector<Hit> Match(std::span<const int32_t> tokens, int32_t first_block, int32_t max_blocks,
                         cache::BlockHash parent, bool* pending = nullptr);
  // Ends the lease Match took on each hit.
  void Release(std::span<const Hit> hits);

  HostKvTierStats Stats() const;

 private:
  struct Entry {
    cache::BlockHash parent;
    std::vector<int32_t> tokens;
    int32_t slot = -1;
    int32_t leases = 0;
    bool committed = false;
    std::list<cache::BlockHash>::iterator lru;  // valid once committed
  };
  explicit HostKvTier(HostKvTierOptions options) : options_(options) {}
  // Drops the least recently used evictable entry; false if there is none.
  bool EvictOne();

  HostKvTierOptions options_;
  std::vector<backend::HostBuffer> arenas_;
  // Slot i is block i % per_arena_ of arena i / per_arena_. Slots below
  // next_fresh_ have been handed out; those given back wait in free_slots_
  // (no per-slot bookkeeping for a tier that is never full).
  Slot SlotAt(int32_t i) const;
  int32_t num_slots_ = 0;
  int32_t per_arena_ = 1;
  int32_t next_fresh_ = 0;
  std::vector<int32_t> free_slots_;
  std::unordered_map<cache::BlockHash, Entry, cache::BlockHashHasher> entries_;
  std::list<cache::BlockHash> lru_;  // committed entries, least recently used first
  int64_t committed_ = 0;
  int64_t hits_ = 0;
  int64_t inserts_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace agentkv::engine
