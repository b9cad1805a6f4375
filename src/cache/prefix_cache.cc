#include "cache/prefix_cache.h"

#include <algorithm>
#include <string>

namespace agentkv::cache {

PrefixCache::PrefixCache(BlockPool* pool, int block_size)
    : pool_(pool), block_size_(block_size), hash_of_block_(pool->num_blocks()) {
  pool_->SetEvictCallback([this](int32_t block) { OnEvict(block); });
}

PrefixCache::~PrefixCache() { pool_->SetEvictCallback(nullptr); }

template <typename F>
int32_t PrefixCache::Walk(std::span<const int32_t> tokens, int32_t first_block, BlockHash parent,
                          int32_t max_blocks, F&& on_hit) const {
  if (block_size_ <= 0 || first_block < 0) return 0;
  const int64_t full = static_cast<int64_t>(tokens.size() / block_size_);
  const int64_t limit = std::min<int64_t>(full - first_block, max_blocks);
  int32_t matched = 0;
  for (; matched < limit; ++matched) {
    auto block_tokens = tokens.subspan(
        (static_cast<size_t>(first_block) + static_cast<size_t>(matched)) * block_size_,
        block_size_);
    BlockHash h = HashBlock(parent, block_tokens);
    auto it = map_.find(h);
    if (it == map_.end()) break;
    const Entry& e = it->second;
    if (!(e.parent == parent) ||
        !std::equal(e.tokens.begin(), e.tokens.end(), block_tokens.begin(), block_tokens.end()))
      break;
    on_hit(e, h);
    parent = h;
  }
  return matched;
}

std::vector<int32_t> PrefixCache::Acquire(std::span<const int32_t> tokens, const BlockHash& root,
                                          int32_t max_blocks, std::vector<BlockHash>* hashes) {
  std::vector<int32_t> blocks;
  // Collect first and take references after: AddRef never evicts, so the
  // entries cannot change under the walk either way, but this keeps Walk const.
  Walk(tokens, 0, root, max_blocks, [&](const Entry& e, const BlockHash& h) {
    blocks.push_back(e.block);
    if (hashes) hashes->push_back(h);
  });
  for (int32_t b : blocks) pool_->AddRef(b);
  const int64_t wanted =
      std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size() / block_size_));
  pool_->RecordPrefixLookup(static_cast<int64_t>(blocks.size()),
                            std::max<int64_t>(0, wanted - static_cast<int64_t>(blocks.size())));
  return blocks;
}

std::vector<int32_t> PrefixCache::AcquireFrom(std::span<const int32_t> tokens, int32_t first_block,
                                              const BlockHash& parent, int32_t max_blocks,
                                              std::vector<BlockHash>* hashes) {
  std::vector<int32_t> blocks;
  Walk(tokens, first_block, parent, max_blocks, [&](const Entry& e, const BlockHash& h) {
    blocks.push_back(e.block);
    if (hashes) hashes->push_back(h);
  });
  for (int32_t b : blocks) pool_->AddRef(b);
  return blocks;
}

int32_t PrefixCache::CountCached(std::span<const int32_t> tokens, const BlockHash& root) const {
  return Walk(tokens, 0, root, INT32_MAX, [](const Entry&, const BlockHash&) {});
}

bool PrefixCache::Insert(const BlockHash& parent, const BlockHash& hash,
                         std::span<const int32_t> tokens, int32_t block) {
  if (block < 0 || block >= pool_->num_blocks()) return false;
  if (static_cast<int>(tokens.size()) != block_size_) return false;
  if (hash_of_block_[block].has_value()) return false;
  if (map_.count(hash)) return false;
  if (!pool_->MarkCached(block)) return false;
  map_.emplace(hash, Entry{parent, block, std::vector<int32_t>(tokens.begin(), tokens.end())});
  hash_of_block_[block] = hash;
  return true;
}

std::optional<int32_t> PrefixCache::Find(const BlockHash& hash) const {
  auto it = map_.find(hash);
  if (it == map_.end()) return std::nullopt;
  return it->second.block;
}

void PrefixCache::OnEvict(int32_t block) {
  if (block < 0 || block >= static_cast<int32_t>(hash_of_block_.size())) return;
  auto& h = hash_of_block_[block];
  if (!h) return;
  if (observer_) {
    auto it = map_.find(*h);
    if (it != map_.end()) observer_(block, *h, it->second.parent, it->second.tokens);
  }
  map_.erase(*h);
  h.reset();
}

void PrefixCache::Clear() {
  for (auto& [hash, e] : map_) {
    hash_of_block_[e.block].reset();
    pool_->Uncache(e.block);
  }
  map_.clear();
}

Status PrefixCache::CheckInvariants() const {
  size_t marked = 0;
  for (int32_t b = 0; b < static_cast<int32_t>(hash_of_block_.size()); ++b) {
    const bool has = hash_of_block_[b].has_value();
    if (has != pool_->IsCached(b))
      return Internal("PrefixCache: block " + std::to_string(b) + " entry/flag mismatch");
    if (!has) continue;
    ++marked;
    auto it = map_.find(*hash_of_block_[b]);
    if (it == map_.end() || it->second.block != b)
      return Internal("PrefixCache: block " + std::to_string(b) + " not indexed by its hash");
  }
  if (marked != map_.size()) return Internal("PrefixCache: stray entries");
  return Status::Ok();
}

}  // namespace agentkv::cache
