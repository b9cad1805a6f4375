// KvCacheManager: block bookkeeping for every sequence across all cache
// groups of one model: one BlockPool per group, one BlockTable per sequence
// per group, and a PrefixCache for the full-attention group.
//
// Step protocol for the scheduler (engine thread):
//   1. AddSequence(id, root); optionally AttachCachedPrefix(id, prompt) ->
//      tokens whose KV is already there.
//   2. Before a step that appends n tokens: EnsureCapacity(id, NumTokens + n,
//      &copies). All-or-nothing: on ResourceExhausted nothing changed, so the
//      scheduler can preempt someone (FreeSequence) and retry.
//   3. The backend performs `copies` (copy-on-write, src -> dst, whole blocks,
//      every layer of the group) before it writes the step's K/V, then
//      CopiesDone() (the manager keeps the sources alive until then).
//   4. After the step: CommitTokens(id, the n tokens). Newly full blocks of
//      the full-attention group go into the prefix cache.
//   5. FreeSequence(id) when done; cached blocks stay until evicted.
//
// Resident agent cache: at the end of a turn, PinForAgent(id) then
// FreeSequence(id). The AgentCache pins the sequence's prefix-cached blocks;
// they are evicted only after every unpinned cached block (tail blocks first,
// since a tail is useless without its head). Next turn, AttachCachedPrefix
// finds them by content like any other prefix; ResidentTokens() says how much
// is still there. Then PinForAgent the new sequence and ReleaseAgentCache the
// old handle. The trailing partial block is not cached (< block_size tokens
// to recompute).
//
// Salts: each sequence's hash chain starts at its root (cache/block_hash.h
// ChainRoot: kRootBlockHash unsalted, else the tenant's salt), so its blocks
// are found only by sequences, restores and tiers using the same root:
// another tenant's identical prompt shares nothing and learns nothing.
//
// Sliding-window models: ring blocks are overwritten in place, so they cannot
// be content-addressed; and a full-attention prefix hit is useless without the
// sliding layers' last window of K/V. So for a model with any sliding group,
// prefix caching and resident agent caches are off (AttachCachedPrefix
// returns 0, PinForAgent returns an empty cache): such agents resume from the
// host/disk tiers or recompute. Fork still works (rings are shared and
// copied on write like partial blocks).
//
// Sliding rings and multi-token steps: a step that appends tokens to a ring
// overwrites slots that its earliest tokens' windows may still cover; the
// backend must read a ring's old K/V for the step's attention before writing
// the step's new K/V into it.
//
// Thread-safety: none; owned by the engine thread. Not copyable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"
#include "cache/block_pool.h"
#include "cache/block_table.h"
#include "cache/model_cache_spec.h"
#include "cache/prefix_cache.h"
#include "util/status.h"

namespace agentkv::cache {

struct KvCacheConfig {
  int block_size = 16;
  std::vector<int32_t> blocks_per_group;  // per spec.groups; see BlocksForBudget
  bool enable_prefix_caching = true;      // forced off for models with sliding groups
};

// Copy the whole of block `src` to block `dst` in group `group`. Same fields
// as engine/backend/backend.h's BlockCopy (which cache/ cannot include).
struct KvBlockCopy {
  int32_t group = 0;
  int32_t src = -1;
  int32_t dst = -1;
  bool operator==(const KvBlockCopy&) const = default;
};

// What a resident agent keeps of its KV between turns: weak pins on its
// prefix-cached blocks (full-attention group), first block first. Copies
// share the same pins: release exactly one with ReleaseAgentCache.
struct AgentCache {
  std::vector<PinRef> pins;
  bool empty() const { return pins.empty(); }
};

class KvCacheManager {
 public:
  using SeqId = int64_t;

  // InvalidArgument if the config does not fit the spec.
  static Result<std::unique_ptr<KvCacheManager>> Create(const ModelCacheSpec& spec,
                                                        KvCacheConfig config);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int block_size() const { return block_size_; }
  int num_groups() const { return static_cast<int>(pools_.size()); }
  bool prefix_caching() const { return prefix_ != nullptr; }

  // Sequences. InvalidArgument for an id in use / NotFound for an unknown one.
  // `root`: where the sequence's hash chain starts (ChainRoot of its salt);
  // every prefix lookup and registration for it uses that chain.
  Status AddSequence(SeqId seq, const BlockHash& root = kRootBlockHash);
  bool HasSequence(SeqId seq) const { return seqs_.count(seq) > 0; }
  // For a sequence with no tokens yet: takes the longest cached prefix of
  // `prompt` (whole blocks, always leaving at least the last prompt token to
  // compute) and returns how many tokens it covers (0 if prefix caching is
  // off). Those tokens count as committed.
  Result<int64_t> AttachCachedPrefix(SeqId seq, std::span<const int32_t> prompt);
  // Tokens of `prompt` that AttachCachedPrefix would cover now, for a
  // sequence whose chain starts at `root`.
  int64_t CachedPrefixTokens(std::span<const int32_t> prompt, const BlockHash& root) const;

  // Makes room for the sequence to hold `num_tokens` tokens in every group,
  // allocating blocks on demand and replacing shared blocks that the step will
  // write (copy-on-write); the copies the backend must do are appended to
  // `copies`. All-or-nothing.
  Status EnsureCapacity(SeqId seq, int64_t num_tokens, std::vector<KvBlockCopy>* copies);
  // Blocks EnsureCapacity(seq, num_tokens) would take from group g's pool.
  int32_t NewBlocksNeeded(SeqId seq, int64_t num_tokens, int group) const;
  // The backend has done every copy handed out so far.
  void CopiesDone();

  // Records that the K/V of `tokens` (appended after NumTokens) is now in the
  // sequence's blocks. InvalidArgument past the capacity EnsureCapacity made.
  Status CommitTokens(SeqId seq, std::span<const int32_t> tokens);

  // `child` (new id) shares every block of `parent`; later writes copy.
  Status Fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks (tail first). Unknown ids are ignored.
  void FreeSequence(SeqId seq);

  int64_t NumTokens(SeqId seq) const;  // committed; 0 for an unknown id
  // The sequence's table in group g (asserts; an empty table for a bad id).
  const BlockTable& Table(SeqId seq, int group) const;
  // Chained hashes of the sequence's committed full blocks (kept for every
  // model: the store can key persisted blocks by them). Empty for a bad id.
  const std::vector<BlockHash>& BlockHashes(SeqId seq) const;

  // Restore from a slower tier (the persistent store): puts `hashes.size()`
  // blocks continuing full block `first_block` of `tokens` (the chain from
  // `root`) into the prefix cache as idle cached blocks, where
  // AttachCachedPrefix finds them. For each block not cached yet it
  // allocates a block of the prefix group, calls `write(i, block)` to fill
  // it (i indexes `hashes`) and registers it under hashes[i]. The cached
  // blocks of `tokens` before it are held meanwhile, so the allocations
  // cannot evict the head of the chain. Requires hashes[i] ==
  // HashBlock(chain from `root` up to block first_block + i) (the caller got
  // them with the data). Stops at the first block that cannot be allocated
  // or written (returns what came before, not an error), and returns 0 when
  // blocks [0, first_block) are no longer all cached. Returns how many
  // blocks it wrote. 0 when prefix caching is off.
  int32_t RestoreBlocks(std::span<const int32_t> tokens, const BlockHash& root, int32_t first_block,
                        std::span<const BlockHash> hashes,
                        const std::function<Status(size_t i, int32_t block)>& write);

  // Split restores (engine/restore_policy.h): the tail of a prefix comes
  // from a slower tier while its head is being recomputed, so the tail's
  // blocks go into the prefix cache before the blocks they continue exist.
  // RestoreHeldBlocks is RestoreBlocks without that requirement: block
  // first_block + i is registered under hashes[i] (which must equal the
  // chain hash of `tokens`, from `root`, up to it) and keeps a reference
  // under `hold` (an id the caller chooses, e.g. the request's), so that
  // nothing evicts it before the head is there. Blocks cached already are
  // held as they are (and count as restored). Stops at the first block that
  // cannot be allocated, written or registered, or whose hash does not
  // match; returns how many blocks are held for the run, from first_block
  // on.
  int32_t RestoreHeldBlocks(int64_t hold, std::span<const int32_t> tokens, const BlockHash& root,
                            int32_t first_block, std::span<const BlockHash> hashes,
                            const std::function<Status(size_t i, int32_t block)>& write);
  // Drops the references taken under `hold`: the blocks stay cached (idle).
  // A no-op for an unknown hold.
  void ReleaseHold(int64_t hold);
  int64_t held_blocks() const;
  // For a sequence whose committed tokens end on a block boundary with no
  // room reserved past them (its prefill stopped there): appends the cached
  // blocks that continue `tokens` after them, leaving at least the last
  // token to compute, as AttachCachedPrefix does for a new sequence. The
  // attached tokens count as committed. Returns how many were attached.
  Result<int64_t> AttachCachedContinuation(SeqId seq, std::span<const int32_t> tokens);

  // The cache group whose blocks the prefix cache (and so the tiers) hold;
  // -1 when prefix caching is off.
  int prefix_group() const { return prefix_ ? prefix_group_ : -1; }

  // Resident agent cache (see above).
  AgentCache PinForAgent(SeqId seq);
  void ReleaseAgentCache(AgentCache* cache);
  // Leading tokens of the agent's cache still resident.
  int64_t ResidentTokens(const AgentCache& cache) const;

  // The block of the prefix-cache group registered under `hash`, if it is
  // still cached (its content is then exactly that block's KV).
  std::optional<int32_t> CachedBlock(const BlockHash& hash) const {
    if (!prefix_) return std::nullopt;
    return prefix_->Find(hash);
  }

  // See PrefixCache::SetEvictObserver (the prefix group's evictions); a
  // no-op when prefix caching is off.
  void SetEvictObserver(PrefixCache::EvictObserver observer) {
    if (prefix_) prefix_->SetEvictObserver(std::move(observer));
  }

  // Evicts up to max_blocks idle cached blocks of group g; returns the count.
  int32_t EvictIdle(int group, int32_t max_blocks);
  BlockPoolStats Stats(int group) const { return pools_.at(group)->Stats(); }
  const BlockPool& pool(int group) const { return *pools_.at(group); }

  // Pool and prefix-cache invariants, and: every block's refcount equals the
  // references the sequences and pending copies hold; rings within bounds;
  // tables sized for the reserved capacity.
  Status CheckInvariants() const;

 private:
  struct Sequence {
    std::vector<BlockTable> tables;  // per group
    std::vector<int32_t> tokens;     // committed
    int64_t reserved = 0;            // tokens the tables have room for
    std::vector<BlockHash> hashes;   // full blocks registered so far (prefix caching)
    BlockHash root;                  // the chain's start (AddSequence)
  };
  KvCacheManager() = default;
  Sequence* Find(SeqId seq);
  const Sequence* Find(SeqId seq) const;
  struct Fill {
    int32_t slot;  // == table size: append
    bool copy;     // the old block's valid tokens must be copied over
  };
  // Slots of group g's table that EnsureCapacity must fill with a new block.
  std::vector<Fill> SlotsToFill(const Sequence& s, int64_t num_tokens, int group) const;
  void RegisterFullBlocks(Sequence& s);

  int block_size_ = 16;
  std::vector<int> ring_blocks_;  // per group; 0 for full attention
  std::vector<std::unique_ptr<BlockPool>> pools_;
  int prefix_group_ = -1;
  std::unique_ptr<PrefixCache> prefix_;
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<KvBlockCopy> pending_copies_;
  // RestoreHeldBlocks' references, per hold (prefix group).
  std::unordered_map<int64_t, std::vector<int32_t>> holds_;
};

}  // namespace agentkv::cache
