#include "cache/kv_memory_budget.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace agentkv::cache {

uint64_t KvBudgetBytes(std::optional<uint64_t> kv_memory_bytes, uint64_t free_memory_bytes,
                       double fraction) {
  if (kv_memory_bytes) return *kv_memory_bytes;
  fraction = std::clamp(fraction, 0.0, 1.0);
  // Rounded, not truncated: 0.85 is not exact in binary and 1000 * 0.85 must
  // not come out as 849.
  const long double bytes = std::roundl(static_cast<long double>(free_memory_bytes) * fraction);
  return std::min(free_memory_bytes, static_cast<uint64_t>(bytes));
}

Result<std::vector<int32_t>> BlocksForBudget(const ModelCacheSpec& spec, int block_size,
                                             uint64_t budget_bytes, int32_t max_num_seqs) {
  if (spec.groups.empty()) return InvalidArgument("BlocksForBudget: spec has no cache groups");
  if (block_size <= 0) return InvalidArgument("BlocksForBudget: block_size must be > 0");
  if (max_num_seqs <= 0) return InvalidArgument("BlocksForBudget: max_num_seqs must be > 0");
  const size_t ng = spec.groups.size();
  std::vector<uint64_t> bytes(ng);
  std::vector<int64_t> cap(ng, -1);  // -1: grows with N
  bool any_full = false;
  for (size_t g = 0; g < ng; ++g) {
    bytes[g] = spec.BytesPerBlock(static_cast<int>(g), block_size);
    if (bytes[g] == 0) return InvalidArgument("BlocksForBudget: group of zero-byte blocks");
    if (spec.groups[g].kind == AttentionKind::kFull) any_full = true;
  }
  for (size_t g = 0; g < ng; ++g)
    if (any_full && spec.groups[g].kind == AttentionKind::kSliding)
      cap[g] =
          static_cast<int64_t>(spec.RingBlocks(static_cast<int>(g), block_size)) * max_num_seqs;

  auto count = [&](size_t g, int64_t n) { return cap[g] < 0 ? n : std::min(n, cap[g]); };
  auto fits = [&](int64_t n) {
    long double cost = 0;
    for (size_t g = 0; g < ng; ++g) cost += static_cast<long double>(count(g, n)) * bytes[g];
    return cost <= static_cast<long double>(budget_bytes);
  };
  // Block ids are int32; stay well inside.
  int64_t lo = 0, hi = int64_t{1} << 30;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  std::vector<int32_t> out(ng);
  for (size_t g = 0; g < ng; ++g) {
    out[g] = static_cast<int32_t>(count(g, lo));
    const int32_t minimum = spec.groups[g].kind == AttentionKind::kSliding
                                ? spec.RingBlocks(static_cast<int>(g), block_size)
                                : 1;
    if (out[g] < minimum)
      return ResourceExhausted("KV memory budget of " + std::to_string(budget_bytes) +
                               " bytes is too small for " + spec.ToString() + " with block size " +
                               std::to_string(block_size));
  }
  return out;
}

}  // namespace agentkv::cache
