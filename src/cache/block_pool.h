// BlockPool: the ids of one cache group's physical KV blocks (the backend owns
// the memory; the pool only decides which id is whose).
//
// Every block is in exactly one state:
//   free    - on the free list, holds nothing useful;
//   in use  - referenced by at least one block table (refcount > 0);
//   cached  - unreferenced but still holds a prefix-cache entry, so a later
//             request with the same prefix can take it back; evictable;
//   pinned  - cached and pinned by at least one resident agent; evictable too,
//             but only after every plain cached block is gone.
// Allocate() takes a free block, else evicts the least-recently-released cached
// block, else the least-recently-released pinned one; referenced blocks are
// never evicted. Eviction tells the prefix cache through the evict callback.
//
// Pins are weak: a PinRef names a block and its generation, which changes
// whenever the block's content stops being what was pinned (freed or evicted),
// so a stale pin is recognised and ignored instead of pinning someone else's
// block.
//
// Thread-safety: none. The pool belongs to the engine thread.
// Misuse (releasing an unreferenced block, referencing a free one) asserts in
// debug builds; in release builds it is ignored, counted, and reported by
// CheckInvariants() rather than corrupting another sequence's KV.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "util/status.h"

namespace agentkv::cache {

struct PinRef {
  int32_t block = -1;
  uint32_t generation = 0;
};

struct BlockPoolStats {
  int32_t total = 0;
  int32_t free = 0;
  int32_t in_use = 0;
  int32_t cached = 0;         // unreferenced, holding a prefix-cache entry, not pinned
  int32_t pinned = 0;         // unreferenced, holding a prefix-cache entry, pinned
  int64_t prefix_hits = 0;    // full blocks found by prefix lookups
  int64_t prefix_misses = 0;  // full blocks prefix lookups looked for and did not find
  int64_t evictions = 0;
};

class BlockPool {
 public:
  using EvictCallback = std::function<void(int32_t block)>;

  explicit BlockPool(int32_t num_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block with refcount 1, or ResourceExhausted when every block is in use.
  Result<int32_t> Allocate();
  // Takes a reference. A cached or pinned block becomes in use again.
  void AddRef(int32_t block);
  // Drops a reference. At zero a cached block becomes evictable (most recently
  // used end of its tier); any other block goes back to the free list.
  void Release(int32_t block);
  int32_t RefCount(int32_t block) const;

  // Called with the block id whenever a cached block is evicted, before the id
  // is reused. Set by the prefix cache.
  void SetEvictCallback(EvictCallback cb) { evict_cb_ = std::move(cb); }
  // Marks an in-use block as holding a prefix-cache entry. False if the block
  // is not referenced.
  bool MarkCached(int32_t block);
  // Drops the block's prefix-cache entry without calling the evict callback
  // (the caller is the prefix cache). Pins on it become stale.
  void Uncache(int32_t block);
  bool IsCached(int32_t block) const;

  // Pins a cached block for a resident agent; nullopt if it is not cached.
  std::optional<PinRef> Pin(int32_t block);
  // Undoes Pin; a no-op for a stale pin.
  void Unpin(const PinRef& pin);
  // True while the pinned block still holds the content it held when pinned.
  bool IsPinValid(const PinRef& pin) const;

  // Evicts up to `max_blocks` unreferenced cached blocks (plain tier first) to
  // the free list; returns how many were evicted.
  int32_t EvictIdle(int32_t max_blocks);

  void RecordPrefixLookup(int64_t hit_blocks, int64_t miss_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Blocks Allocate() can hand out before it fails: free + cached + pinned.
  int32_t NumAvailable() const;
  BlockPoolStats Stats() const;

  // Checks that every block is in exactly one state and that the counters,
  // lists and refcounts agree. Internal on the first violation.
  Status CheckInvariants() const;

 private:
  enum class State : uint8_t { kFree, kInUse, kCached, kPinned };
  struct Block {
    int32_t refs = 0;
    int32_t pins = 0;
    uint32_t generation = 0;
    bool cached = false;
    State state = State::kFree;
    int32_t prev = -1;  // neighbours in the cached or pinned list
    int32_t next = -1;
  };
  // Intrusive doubly linked list over blocks_, least recently released first.
  struct IdleList {
    int32_t head = -1;
    int32_t tail = -1;
    int32_t size = 0;
  };

  bool Valid(int32_t block) const { return block >= 0 && block < num_blocks(); }
  IdleList& ListFor(State s) { return s == State::kPinned ? pinned_ : cached_; }
  void PushBack(IdleList& list, int32_t block);
  void Unlink(IdleList& list, int32_t block);
  void MakeIdle(int32_t block);
  // Removes `block` from its idle list and forgets its cache entry.
  void EvictOne(int32_t block);
  void Misuse();

  std::vector<Block> blocks_;
  std::vector<int32_t> free_;
  IdleList cached_;
  IdleList pinned_;
  int32_t in_use_ = 0;
  EvictCallback evict_cb_;
  int64_t prefix_hits_ = 0;
  int64_t prefix_misses_ = 0;
  int64_t evictions_ = 0;
  int64_t misuses_ = 0;
};

}  // namespace agentkv::cache
