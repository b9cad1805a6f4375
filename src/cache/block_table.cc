#include "cache/block_table.h"

namespace agentkv::cache {

int32_t BlockTable::BlockAt(int64_t pos) const {
  if (pos < 0 || block_size_ <= 0) return -1;
  const int32_t slot = SlotOf(pos / block_size_);
  return slot < size() ? blocks_[slot] : -1;
}

}  // namespace agentkv::cache
