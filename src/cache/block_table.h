// BlockTable: the physical block ids of one sequence in one cache group, in
// the order the backend reads them.
//
// Linear (full attention): slot i holds tokens [i * block_size, (i + 1) *
// block_size). Ring (sliding window, ring_blocks > 0): at most ring_blocks
// slots; logical block b of the sequence lives in slot b % ring_blocks and
// overwrites the logical block ring_blocks before it, which no query needs
// any more (ring_blocks = ceil(window / block_size) + 1).
//
// The table only stores ids; KvCacheManager owns the references they stand
// for and is the only writer. Thread-safety: none.
#pragma once

#include <cstdint>
#include <vector>

namespace agentkv::cache {

class BlockTable {
 public:
  BlockTable(int block_size, int ring_blocks) : block_size_(block_size), ring_(ring_blocks) {}

  int block_size() const { return block_size_; }
  bool is_ring() const { return ring_ > 0; }
  int ring_blocks() const { return ring_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  int32_t size() const { return static_cast<int32_t>(blocks_.size()); }

  // Slot of logical block `logical` (its index in blocks()).
  int32_t SlotOf(int64_t logical) const {
    return static_cast<int32_t>(is_ring() ? logical % ring_ : logical);
  }
  // Physical block holding token position `pos`, or -1 if no slot exists yet.
  int32_t BlockAt(int64_t pos) const;

  // Mutators for KvCacheManager.
  void Append(int32_t block) { blocks_.push_back(block); }
  void Set(int32_t slot, int32_t block) { blocks_[slot] = block; }
  void Clear() { blocks_.clear(); }

 private:
  int block_size_;
  int ring_;
  std::vector<int32_t> blocks_;
};

}  // namespace agentkv::cache
