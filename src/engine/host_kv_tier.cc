#include "engine/host_kv_tier.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

namespace agentkv::engine {

Result<std::unique_ptr<HostKvTier>> HostKvTier::Create(backend::Backend& backend,
                                                       HostKvTierOptions options) {
  if (options.block_bytes == 0 || options.block_size <= 0)
    return InvalidArgument("host KV tier: block size is zero");
  const size_t blocks = options.capacity_bytes / options.block_bytes;
  if (blocks == 0)
    return InvalidArgument("host KV tier: " + std::to_string(options.capacity_bytes) +
                           " bytes hold no block of " + std::to_string(options.block_bytes));
  if (blocks > static_cast<size_t>(INT32_MAX))
    return InvalidArgument("host KV tier: too many blocks of " +
                           std::to_string(options.block_bytes) + " bytes");
  std::unique_ptr<HostKvTier> t(new HostKvTier(options));
  const size_t per_arena =
      std::min(blocks, std::max<size_t>(1, options.arena_bytes / options.block_bytes));
  for (size_t done = 0; done < blocks;) {
    const size_t n = std::min(per_arena, blocks - done);
    ASSIGN_OR_RETURN(backend::HostBuffer b, backend.AllocateHostBuffer(n * options.block_bytes));
    t->arenas_.push_back(std::move(b));
    done += n;
  }
  t->num_slots_ = static_cast<int32_t>(blocks);
  t->per_arena_ = static_cast<int32_t>(per_arena);
  t->options_.capacity_bytes = blocks * options.block_bytes;
  return t;
}

HostKvTier::Slot HostKvTier::SlotAt(int32_t i) const {
  return arenas_[static_cast<size_t>(i / per_arena_)].span().subspan(
      static_cast<size_t>(i % per_arena_) * options_.block_bytes, options_.block_bytes);
}

bool HostKvTier::Contains(const cache::BlockHash& hash) const {
  auto it = entries_.find(hash);
  return it != entries_.end() && it->second.committed;
}

bool HostKvTier::Touch(const cache::BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || !it->second.committed) return false;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return true;
}

bool HostKvTier::EvictOne() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto e = entries_.find(*it);
    if (e->second.leases > 0) continue;
    free_slots_.push_back(e->second.slot);
    lru_.erase(it);
    entries_.erase(e);
    --committed_;
    ++evictions_;
    return true;
  }
  return false;
}

HostKvTier::Slot HostKvTier::Reserve(const cache::BlockHash& parent, const cache::BlockHash& hash,
                                     std::span<const int32_t> tokens) {
  if (static_cast<int>(tokens.size()) != options_.block_size) return {};
  if (entries_.count(hash)) return {};
  // Fresh slots are handed out lowest first, so that a chain stored in
  // order lands in adjacent slots (one copy per run to and from the device).
  if (free_slots_.empty() && next_fresh_ < num_slots_) free_slots_.push_back(next_fresh_++);
  if (free_slots_.empty() && !EvictOne()) return {};
  Entry e;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.slot = free_slots_.back();
  free_slots_.pop_back();
  const int32_t slot = e.slot;
  entries_.emplace(hash, std::move(e));
  return SlotAt(slot);
}

void HostKvTier::Commit(const cache::BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.committed) return;
  it->second.committed = true;
  it->second.lru = lru_.insert(lru_.end(), hash);
  ++committed_;
  ++inserts_;
}

void HostKvTier::Abort(const cache::BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.committed) return;
  free_slots_.push_back(it->second.slot);
  entries_.erase(it);
}

bool HostKvTier::Insert(const cache::BlockHash& parent, const cache::BlockHash& hash,
                        std::span<const int32_t> tokens, std::span<const std::byte> data) {
  if (data.size() != options_.block_bytes) return false;
  Slot s = Reserve(parent, hash, tokens);
  if (s.empty()) return false;
  std::memcpy(s.data(), data.data(), data.size());
  Commit(hash);
  return true;
}

std::vector<HostKvTier::Hit> HostKvTier::Match(std::span<const int32_t> tokens, int32_t first_block,
                                               int32_t max_blocks, cache::BlockHash parent,
                                               bool* pending) {
  std::vector<Hit> hits;
  if (pending != nullptr) *pending = false;
  const int bs = options_.block_size;
  const int64_t full = static_cast<int64_t>(tokens.size()) / bs;
  const int64_t end = std::min<int64_t>(full, static_cast<int64_t>(first_block) + max_blocks);
  for (int64_t i = first_block; i < end; ++i) {
    const std::span<const int32_t> bt = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const cache::BlockHash h = cache::HashBlock(parent, bt);
    auto it = entries_.find(h);
    if (it == entries_.end()) break;
    Entry& e = it->second;
    if (!e.committed && pending != nullptr) *pending = true;
    if (!e.committed || !(e.parent == parent) ||
        !std::equal(e.tokens.begin(), e.tokens.end(), bt.begin(), bt.end()))
      break;
    ++e.leases;
    lru_.splice(lru_.end(), lru_, e.lru);
    hits.push_back(Hit{h, SlotAt(e.slot)});
    parent = h;
  }
  hits_ += static_cast<int64_t>(hits.size());
  return hits;
}

void HostKvTier::Release(std::span<const Hit> hits) {
  for (const Hit& h : hits) {
    auto it = entries_.find(h.hash);
    if (it != entries_.end() && it->second.leases > 0) --it->second.leases;
  }
}

HostKvTierStats HostKvTier::Stats() const {
  HostKvTierStats s;
  s.capacity_bytes = static_cast<int64_t>(options_.capacity_bytes);
  s.blocks = committed_;
  s.bytes = committed_ * static_cast<int64_t>(options_.block_bytes);
  s.hits = hits_;
  s.inserts = inserts_;
  s.evictions = evictions_;
  return s;
}

}  // namespace agentkv::engine
