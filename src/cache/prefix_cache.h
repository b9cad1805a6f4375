// PrefixCache: content-addressed index of the full blocks of one
// full-attention cache group (BlockHash -> block id), so that sequences and
// agents with a common prefix share physical blocks read-only.
//
// It holds no references. An entry lives as long as its block holds the
// content: while some sequence references the block, and afterwards while the
// pool keeps the block cached (LRU, evictable). When the pool evicts the block
// it tells the cache through the evict callback and the entry goes.
//
// Sliding-window groups never use it: ring blocks are overwritten in place.
//
// Thread-safety: none; same owner as the pool. The pool must outlive the cache,
// and the cache owns the pool's evict callback.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"
#include "cache/block_pool.h"

namespace agentkv::cache {

class PrefixCache {
 public:
  PrefixCache(BlockPool* pool, int block_size);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int block_size() const { return block_size_; }

  // The blocks of the longest cached prefix of `tokens` in the chain that
  // starts at `root` (ChainRoot of the request's salt), at most `max_blocks`
  // of them, with a reference taken on each (the caller releases them). Each
  // step checks the chained hash, the parent hash and the stored tokens, so
  // blocks of another root are never matched. Appends the matched blocks'
  // hashes to `hashes` if given. Counts hits and misses in the pool's stats.
  std::vector<int32_t> Acquire(std::span<const int32_t> tokens, const BlockHash& root,
                               int32_t max_blocks, std::vector<BlockHash>* hashes = nullptr);
  // Acquire for the blocks that continue full block `first_block` of
  // `tokens`, whose chain hash before it is `parent` (the caller holds the
  // head, or knows its hashes): at most `max_blocks` of them. Counts nothing.
  std::vector<int32_t> AcquireFrom(std::span<const int32_t> tokens, int32_t first_block,
                                   const BlockHash& parent, int32_t max_blocks,
                                   std::vector<BlockHash>* hashes = nullptr);
  // Number of leading full blocks of `tokens` (chain from `root`) that
  // Acquire would return now; takes nothing and counts nothing.
  int32_t CountCached(std::span<const int32_t> tokens, const BlockHash& root) const;

  // Registers referenced block `block`, holding `tokens` (exactly block_size)
  // after a block whose hash is `parent`, under `hash`. False (and nothing
  // changes) if `hash` is already registered (to this or another block), if the
  // block already holds another entry, or if the block is not referenced.
  bool Insert(const BlockHash& parent, const BlockHash& hash, std::span<const int32_t> tokens,
              int32_t block);

  std::optional<int32_t> Find(const BlockHash& hash) const;

  // Called whenever the pool evicts a cached block, before its entry goes
  // and before the block id is reused, with what the block holds (so that a
  // slower tier can keep a copy). Not called by Clear. Null: none.
  using EvictObserver =
      std::function<void(int32_t block, const BlockHash& hash, const BlockHash& parent,
                         std::span<const int32_t> tokens)>;
  void SetEvictObserver(EvictObserver observer) { observer_ = std::move(observer); }

  size_t size() const { return map_.size(); }
  // Forgets every entry; idle cached blocks go back to the free list.
  void Clear();

  // Entries and pool flags agree one to one.
  Status CheckInvariants() const;

 private:
  struct Entry {
    BlockHash parent;
    int32_t block = -1;
    std::vector<int32_t> tokens;
  };
  // Walks the chain; calls `on_hit(entry, hash)` per matched block.
  template <typename F>
  int32_t Walk(std::span<const int32_t> tokens, int32_t first_block, BlockHash parent,
               int32_t max_blocks, F&& on_hit) const;
  void OnEvict(int32_t block);

  BlockPool* pool_;
  int block_size_;
  std::unordered_map<BlockHash, Entry, BlockHashHasher> map_;
  std::vector<std::optional<BlockHash>> hash_of_block_;
  EvictObserver observer_;
};

}  // namespace agentkv::cache
