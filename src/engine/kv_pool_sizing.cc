#include "engine/kv_pool_sizing.h"

#include <algorithm>
#include <optional>

#include "cache/kv_memory_budget.h"

namespace agentkv::engine {

std::vector<int32_t> MinimumBlocks(const cache::ModelCacheSpec& spec, int block_size) {
  std::vector<int32_t> out(spec.groups.size());
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    out[g] = std::max(1, spec.RingBlocks(static_cast<int>(g), block_size));
  }
  return out;
}

uint64_t PoolBytes(const cache::ModelCacheSpec& spec, int block_size,
                   const std::vector<int32_t>& blocks) {
  uint64_t total = 0;
  for (size_t g = 0; g < blocks.size() && g < spec.groups.size(); ++g) {
    total += static_cast<uint64_t>(spec.BytesPerBlock(static_cast<int>(g), block_size)) *
             static_cast<uint64_t>(std::max(blocks[g], 0));
  }
  return total;
}

int64_t SequenceCapacity(const cache::ModelCacheSpec& spec, int block_size,
                         const std::vector<int32_t>& blocks, int64_t max_context) {
  std::optional<int64_t> cap;
  for (size_t g = 0; g < blocks.size() && g < spec.groups.size(); ++g) {
    if (spec.groups[g].kind != cache::AttentionKind::kFull) continue;
    const int64_t tokens = static_cast<int64_t>(blocks[g]) * block_size;
    cap = cap ? std::min(*cap, tokens) : tokens;
  }
  return cap.value_or(max_context);
}

Result<std::vector<int32_t>> SizeKvPool(backend::Backend& backend, int block_size,
                                        const KvPoolSize& size, int max_step_tokens,
                                        int max_batch) {
  const cache::ModelCacheSpec& spec = backend.cache_spec();
  if (!size.blocks_per_group.empty()) return size.blocks_per_group;
  if (size.bytes > 0) return BlocksForBudget(spec, block_size, size.bytes, max_batch);
  const double fraction = size.fraction > 0 ? size.fraction : backend.default_kv_memory_fraction();
  if (!(fraction > 0 && fraction <= 1)) {
    return InvalidArgument("KV memory fraction must be in (0, 1]");
  }
  const std::vector<int32_t> probe = MinimumBlocks(spec, block_size);
  backend::KvLayout layout;
  layout.block_size = block_size;
  for (size_t g = 0; g < probe.size(); ++g) layout.blocks_per_group[g] = probe[g];
  RETURN_IF_ERROR(backend.AllocateKv(layout));
  RETURN_IF_ERROR(backend.Reserve(max_step_tokens, max_batch));
  ASSIGN_OR_RETURN(const uint64_t free, backend.FreeMemoryBytes());
  const uint64_t budget =
      cache::KvBudgetBytes(std::nullopt, free + PoolBytes(spec, block_size, probe), fraction);
  return BlocksForBudget(spec, block_size, budget, max_batch);
}

}  // namespace agentkv::engine
