#include "cache/kv_cache_manager.h"

#include <algorithm>
#include <cassert>
#include <string>

namespace agentkv::cache {

Result<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(const ModelCacheSpec& spec,
                                                               KvCacheConfig config) {
  if (spec.groups.empty()) return InvalidArgument("KvCacheManager: spec has no cache groups");
  if (config.block_size <= 0) return InvalidArgument("KvCacheManager: block_size must be > 0");
  if (config.blocks_per_group.size() != spec.groups.size())
    return InvalidArgument("KvCacheManager: " + std::to_string(config.blocks_per_group.size()) +
                           " block counts for " + std::to_string(spec.groups.size()) +
                           " cache groups");
  std::unique_ptr<KvCacheManager> m(new KvCacheManager());
  m->block_size_ = config.block_size;
  bool any_sliding = false;
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    if (config.blocks_per_group[g] <= 0)
      return InvalidArgument("KvCacheManager: group " + std::to_string(g) + " has no blocks");
    const bool sliding = spec.groups[g].kind == AttentionKind::kSliding;
    if (sliding && spec.groups[g].window <= 0)
      return InvalidArgument("KvCacheManager: sliding group without a window");
    any_sliding |= sliding;
    m->ring_blocks_.push_back(spec.RingBlocks(static_cast<int>(g), config.block_size));
    m->pools_.push_back(std::make_unique<BlockPool>(config.blocks_per_group[g]));
    if (!sliding && m->prefix_group_ < 0) m->prefix_group_ = static_cast<int>(g);
  }
  if (config.enable_prefix_caching && !any_sliding && m->prefix_group_ >= 0) {
    m->prefix_ =
        std::make_unique<PrefixCache>(m->pools_[m->prefix_group_].get(), config.block_size);
  }
  return m;
}

KvCacheManager::Sequence* KvCacheManager::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const KvCacheManager::Sequence* KvCacheManager::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

Status KvCacheManager::AddSequence(SeqId seq, const BlockHash& root) {
  if (seqs_.count(seq)) return InvalidArgument("sequence " + std::to_string(seq) + " exists");
  Sequence s;
  s.root = root;
  for (int r : ring_blocks_) s.tables.emplace_back(block_size_, r);
  seqs_.emplace(seq, std::move(s));
  return Status::Ok();
}

Result<int64_t> KvCacheManager::AttachCachedPrefix(SeqId seq, std::span<const int32_t> prompt) {
  Sequence* s = Find(seq);
  if (!s) return NotFound("sequence " + std::to_string(seq));
  if (!s->tokens.empty() || s->reserved > 0)
    return InvalidArgument("AttachCachedPrefix: sequence " + std::to_string(seq) +
                           " already has tokens");
  if (!prefix_ || prompt.empty()) return int64_t{0};
  // The last prompt token is always computed: its logits start the reply.
  const int32_t max_blocks = static_cast<int32_t>((prompt.size() - 1) / block_size_);
  std::vector<int32_t> blocks = prefix_->Acquire(prompt, s->root, max_blocks, &s->hashes);
  for (int32_t b : blocks) s->tables[prefix_group_].Append(b);
  const int64_t n = static_cast<int64_t>(blocks.size()) * block_size_;
  s->tokens.assign(prompt.begin(), prompt.begin() + n);
  s->reserved = n;
  return n;
}

int64_t KvCacheManager::CachedPrefixTokens(std::span<const int32_t> prompt,
                                           const BlockHash& root) const {
  if (!prefix_ || prompt.empty()) return 0;
  const int64_t max_blocks = static_cast<int64_t>(prompt.size() - 1) / block_size_;
  const int64_t found = prefix_->CountCached(prompt, root);
  return std::min(found, max_blocks) * block_size_;
}

std::vector<KvCacheManager::Fill> KvCacheManager::SlotsToFill(const Sequence& s, int64_t num_tokens,
                                                              int group) const {
  std::vector<Fill> fills;
  const int64_t have = static_cast<int64_t>(s.tokens.size());
  if (num_tokens <= have) return fills;
  const BlockTable& t = s.tables[group];
  const BlockPool& pool = *pools_[group];
  const int64_t first = have / block_size_;
  int64_t last = (num_tokens - 1) / block_size_;
  // Later logical blocks of a ring land on slots already visited in this call.
  if (t.is_ring()) last = std::min<int64_t>(last, first + t.ring_blocks() - 1);
  for (int64_t l = first; l <= last; ++l) {
    const int32_t slot = t.SlotOf(l);
    if (slot >= t.size()) {
      fills.push_back({slot, false});
    } else if (pool.RefCount(t.blocks()[slot]) > 1) {
      // Copy whatever holds committed tokens: the partial last block, and for a
      // ring every written slot, since the step's attention reads the old
      // window before the backend overwrites it. A slot first used by logical
      // block `slot` holds committed tokens iff that block started before
      // `have`; linear tables only reach here for blocks >= first.
      fills.push_back({slot, static_cast<int64_t>(slot) * block_size_ < have});
    }
  }
  return fills;
}

int32_t KvCacheManager::NewBlocksNeeded(SeqId seq, int64_t num_tokens, int group) const {
  const Sequence* s = Find(seq);
  if (!s || group < 0 || group >= num_groups()) return 0;
  return static_cast<int32_t>(SlotsToFill(*s, num_tokens, group).size());
}

Status KvCacheManager::EnsureCapacity(SeqId seq, int64_t num_tokens,
                                      std::vector<KvBlockCopy>* copies) {
  Sequence* s = Find(seq);
  if (!s) return NotFound("sequence " + std::to_string(seq));
  if (num_tokens < 0) return InvalidArgument("EnsureCapacity: negative token count");
  std::vector<std::vector<Fill>> fills(num_groups());
  for (int g = 0; g < num_groups(); ++g) {
    fills[g] = SlotsToFill(*s, num_tokens, g);
    const int32_t need = static_cast<int32_t>(fills[g].size());
    if (need > pools_[g]->NumAvailable())
      return ResourceExhausted("KV cache group " + std::to_string(g) + ": need " +
                               std::to_string(need) + " blocks, " +
                               std::to_string(pools_[g]->NumAvailable()) + " available");
  }
  for (int g = 0; g < num_groups(); ++g) {
    if (!fills[g].empty() &&
        std::any_of(fills[g].begin(), fills[g].end(), [](const Fill& f) { return f.copy; }) &&
        copies == nullptr)
      return InvalidArgument("EnsureCapacity: copy-on-write needed but no copy list given");
  }
  for (int g = 0; g < num_groups(); ++g) {
    BlockTable& t = s->tables[g];
    BlockPool& pool = *pools_[g];
    for (const Fill& f : fills[g]) {
      Result<int32_t> b = pool.Allocate();
      // Checked above: the pool had enough free or evictable blocks, and
      // nothing this call holds is evictable.
      if (!b.ok()) return Internal("EnsureCapacity: " + b.status().ToString());
      if (f.slot >= t.size()) {
        if (f.slot != t.size()) return Internal("EnsureCapacity: gap in block table");
        t.Append(*b);
        continue;
      }
      const int32_t old = t.blocks()[f.slot];
      if (f.copy) {
        // The sequence's reference on `old` moves to the pending copy.
        pending_copies_.push_back({g, old, *b});
        copies->push_back({g, old, *b});
      } else {
        pool.Release(old);
      }
      t.Set(f.slot, *b);
    }
  }
  s->reserved = std::max(s->reserved, num_tokens);
  return Status::Ok();
}

void KvCacheManager::CopiesDone() {
  for (const KvBlockCopy& c : pending_copies_) pools_[c.group]->Release(c.src);
  pending_copies_.clear();
}

Status KvCacheManager::CommitTokens(SeqId seq, std::span<const int32_t> tokens) {
  Sequence* s = Find(seq);
  if (!s) return NotFound("sequence " + std::to_string(seq));
  if (static_cast<int64_t>(s->tokens.size() + tokens.size()) > s->reserved)
    return InvalidArgument("CommitTokens: " + std::to_string(tokens.size()) +
                           " tokens exceed the capacity made by EnsureCapacity");
  s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
  RegisterFullBlocks(*s);
  return Status::Ok();
}

void KvCacheManager::RegisterFullBlocks(Sequence& s) {
  const size_t full = s.tokens.size() / block_size_;
  std::span<const int32_t> all(s.tokens);
  for (size_t i = s.hashes.size(); i < full; ++i) {
    const BlockHash parent = i == 0 ? s.root : s.hashes[i - 1];
    auto block_tokens = all.subspan(i * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, block_tokens);
    s.hashes.push_back(h);
    // A duplicate (another sequence computed the same block first) stays
    // private to this sequence; the chain is still valid because the hash
    // names the content, not the block.
    if (prefix_) prefix_->Insert(parent, h, block_tokens, s.tables[prefix_group_].blocks()[i]);
  }
}

Status KvCacheManager::Fork(SeqId parent, SeqId child) {
  const Sequence* p = Find(parent);
  if (!p) return NotFound("sequence " + std::to_string(parent));
  if (seqs_.count(child)) return InvalidArgument("sequence " + std::to_string(child) + " exists");
  Sequence c = *p;
  for (int g = 0; g < num_groups(); ++g)
    for (int32_t b : c.tables[g].blocks()) pools_[g]->AddRef(b);
  seqs_.emplace(child, std::move(c));
  return Status::Ok();
}

void KvCacheManager::FreeSequence(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int g = 0; g < num_groups(); ++g) {
    const auto& blocks = it->second.tables[g].blocks();
    // Tail first: the tail enters the LRU first and so is evicted first; a
    // cached tail is useless once its head is gone.
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pools_[g]->Release(*b);
  }
  seqs_.erase(it);
}

int64_t KvCacheManager::NumTokens(SeqId seq) const {
  const Sequence* s = Find(seq);
  return s ? static_cast<int64_t>(s->tokens.size()) : 0;
}

const BlockTable& KvCacheManager::Table(SeqId seq, int group) const {
  static const BlockTable kEmpty(1, 0);
  const Sequence* s = Find(seq);
  assert(s && group >= 0 && group < num_groups());
  if (!s || group < 0 || group >= num_groups()) return kEmpty;
  return s->tables[group];
}

const std::vector<BlockHash>& KvCacheManager::BlockHashes(SeqId seq) const {
  static const std::vector<BlockHash> kEmpty;
  const Sequence* s = Find(seq);
  return s ? s->hashes : kEmpty;
}

int32_t KvCacheManager::RestoreBlocks(std::span<const int32_t> tokens, const BlockHash& root,
                                      int32_t first_block, std::span<const BlockHash> hashes,
                                      const std::function<Status(size_t i, int32_t block)>& write) {
  if (!prefix_ || first_block < 0) return 0;
  const int64_t end = static_cast<int64_t>(first_block) + static_cast<int64_t>(hashes.size());
  if (end * block_size_ > static_cast<int64_t>(tokens.size())) return 0;
  BlockPool& pool = *pools_[prefix_group_];
  std::vector<BlockHash> chain;
  // References on the cached head (and, below, on each new block) until the
  // end, so that allocating one restored block never evicts another.
  std::vector<int32_t> held = prefix_->Acquire(tokens, root, static_cast<int32_t>(end), &chain);
  int32_t written = 0;
  if (static_cast<int32_t>(held.size()) >= first_block) {
    for (int64_t i = static_cast<int64_t>(held.size()); i < end; ++i) {
      const size_t j = static_cast<size_t>(i - first_block);
      const BlockHash parent = i == 0 ? root : chain[i - 1];
      auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
      if (HashBlock(parent, block_tokens) != hashes[j]) break;
      Result<int32_t> b = pool.Allocate();
      if (!b.ok()) break;
      held.push_back(*b);
      if (!write(j, *b).ok() || !prefix_->Insert(parent, hashes[j], block_tokens, *b)) break;
      chain.push_back(hashes[j]);
      ++written;
    }
  }
  // Tail first, so that the head ends up most recently used.
  for (auto it = held.rbegin(); it != held.rend(); ++it) pool.Release(*it);
  return written;
}

int32_t KvCacheManager::RestoreHeldBlocks(
    int64_t hold, std::span<const int32_t> tokens, const BlockHash& root, int32_t first_block,
    std::span<const BlockHash> hashes,
    const std::function<Status(size_t i, int32_t block)>& write) {
  if (!prefix_ || first_block < 0) return 0;
  const int64_t end = static_cast<int64_t>(first_block) + static_cast<int64_t>(hashes.size());
  if (end * block_size_ > static_cast<int64_t>(tokens.size())) return 0;
  BlockPool& pool = *pools_[prefix_group_];
  BlockHash parent = root;
  if (first_block > 0)
    parent = HashFullBlocks(tokens.first(static_cast<size_t>(first_block) * block_size_),
                            block_size_, root)
                 .back();
  std::vector<int32_t>& held = holds_[hold];
  int32_t done = 0;
  for (int64_t i = first_block; i < end; ++i) {
    const size_t j = static_cast<size_t>(i - first_block);
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    if (HashBlock(parent, block_tokens) != hashes[j]) break;
    if (std::optional<int32_t> cached = prefix_->Find(hashes[j])) {
      pool.AddRef(*cached);
      held.push_back(*cached);
    } else {
      Result<int32_t> b = pool.Allocate();
      if (!b.ok()) break;
      if (!write(j, *b).ok() || !prefix_->Insert(parent, hashes[j], block_tokens, *b)) {
        pool.Release(*b);
        break;
      }
      held.push_back(*b);
    }
    parent = hashes[j];
    ++done;
  }
  if (held.empty()) holds_.erase(hold);
  return done;
}

void KvCacheManager::ReleaseHold(int64_t hold) {
  auto it = holds_.find(hold);
  if (it == holds_.end()) return;
  BlockPool& pool = *pools_[prefix_group_];
  // Tail first, so that the head of the run stays most recently used.
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) pool.Release(*b);
  holds_.erase(it);
}

int64_t KvCacheManager::held_blocks() const {
  int64_t n = 0;
  for (const auto& [id, blocks] : holds_) n += static_cast<int64_t>(blocks.size());
  return n;
}

Result<int64_t> KvCacheManager::AttachCachedContinuation(SeqId seq,
                                                         std::span<const int32_t> tokens) {
  Sequence* s = Find(seq);
  if (!s) return NotFound("sequence " + std::to_string(seq));
  const int64_t have = static_cast<int64_t>(s->tokens.size());
  if (have % block_size_ != 0 || s->reserved != have)
    return InvalidArgument("AttachCachedContinuation: sequence " + std::to_string(seq) +
                           " does not end on a block boundary with nothing reserved");
  if (static_cast<int64_t>(tokens.size()) < have ||
      !std::equal(s->tokens.begin(), s->tokens.end(), tokens.begin()))
    return InvalidArgument("AttachCachedContinuation: tokens do not continue the sequence");
  if (!prefix_ || tokens.empty()) return int64_t{0};
  const int64_t max_end = static_cast<int64_t>(tokens.size() - 1) / block_size_;
  const int64_t first = have / block_size_;
  if (max_end <= first) return int64_t{0};
  const BlockHash parent = first == 0 ? s->root : s->hashes.back();
  std::vector<int32_t> blocks =
      prefix_->AcquireFrom(tokens, static_cast<int32_t>(first), parent,
                           static_cast<int32_t>(max_end - first), &s->hashes);
  for (int32_t b : blocks) s->tables[prefix_group_].Append(b);
  const int64_t n = static_cast<int64_t>(blocks.size()) * block_size_;
  s->tokens.insert(s->tokens.end(), tokens.begin() + have, tokens.begin() + have + n);
  s->reserved = have + n;
  return n;
}

AgentCache KvCacheManager::PinForAgent(SeqId seq) {
  AgentCache cache;
  const Sequence* s = Find(seq);
  if (!s || !prefix_) return cache;
  std::vector<int32_t> blocks;
  for (const BlockHash& h : s->hashes) {
    std::optional<int32_t> b = prefix_->Find(h);
    if (!b) break;
    blocks.push_back(*b);
  }
  // Pinned tail first so that idle pinned blocks are evicted tail first too.
  cache.pins.resize(blocks.size());
  BlockPool& pool = *pools_[prefix_group_];
  for (size_t i = blocks.size(); i-- > 0;) cache.pins[i] = *pool.Pin(blocks[i]);
  return cache;
}

void KvCacheManager::ReleaseAgentCache(AgentCache* cache) {
  if (!cache) return;
  if (prefix_) {
    BlockPool& pool = *pools_[prefix_group_];
    for (auto p = cache->pins.rbegin(); p != cache->pins.rend(); ++p) pool.Unpin(*p);
  }
  cache->pins.clear();
}

int64_t KvCacheManager::ResidentTokens(const AgentCache& cache) const {
  if (!prefix_) return 0;
  const BlockPool& pool = *pools_[prefix_group_];
  int64_t n = 0;
  for (const PinRef& p : cache.pins) {
    if (!pool.IsPinValid(p)) break;
    ++n;
  }
  return n * block_size_;
}

int32_t KvCacheManager::EvictIdle(int group, int32_t max_blocks) {
  if (group < 0 || group >= num_groups()) return 0;
  return pools_[group]->EvictIdle(max_blocks);
}

Status KvCacheManager::CheckInvariants() const {
  for (int g = 0; g < num_groups(); ++g)
    RETURN_IF_ERROR(pools_[g]->CheckInvariants().WithContext("group " + std::to_string(g)));
  if (prefix_) RETURN_IF_ERROR(prefix_->CheckInvariants());
  std::vector<std::vector<int32_t>> refs(num_groups());
  for (int g = 0; g < num_groups(); ++g) refs[g].assign(pools_[g]->num_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    const std::string who = "sequence " + std::to_string(id) + ": ";
    if (static_cast<int64_t>(s.tokens.size()) > s.reserved)
      return Internal(who + "more tokens than capacity");
    if (s.hashes.size() != s.tokens.size() / block_size_)
      return Internal(who + "hash chain length is off");
    const int64_t logical = (s.reserved + block_size_ - 1) / block_size_;
    for (int g = 0; g < num_groups(); ++g) {
      const BlockTable& t = s.tables[g];
      const int64_t want = t.is_ring() ? std::min<int64_t>(logical, t.ring_blocks()) : logical;
      if (t.size() != want)
        return Internal(who + "group " + std::to_string(g) + " has " + std::to_string(t.size()) +
                        " blocks, expected " + std::to_string(want));
      for (int32_t b : t.blocks()) {
        if (b < 0 || b >= pools_[g]->num_blocks()) return Internal(who + "bad block id");
        ++refs[g][b];
      }
    }
    if (prefix_) {
      const auto& blocks = s.tables[prefix_group_].blocks();
      for (size_t i = 0; i < s.hashes.size(); ++i) {
        if (!pools_[prefix_group_]->IsCached(blocks[i])) continue;
        std::optional<int32_t> e = prefix_->Find(s.hashes[i]);
        if (!e || *e != blocks[i]) return Internal(who + "cached block under a foreign hash");
      }
    }
  }
  for (const KvBlockCopy& c : pending_copies_) ++refs[c.group][c.src];
  for (const auto& [hold, blocks] : holds_)
    for (int32_t b : blocks) ++refs[prefix_group_][b];
  for (int g = 0; g < num_groups(); ++g)
    for (int32_t b = 0; b < pools_[g]->num_blocks(); ++b)
      if (refs[g][b] != pools_[g]->RefCount(b))
        return Internal("group " + std::to_string(g) + " block " + std::to_string(b) +
                        ": refcount " + std::to_string(pools_[g]->RefCount(b)) + ", held " +
                        std::to_string(refs[g][b]) + " times");
  return Status::Ok();
}

}  // namespace agentkv::cache
