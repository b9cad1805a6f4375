// How many KV blocks each cache group gets from a memory budget.
//
// Full-attention groups grow with context, sliding groups do not (a sequence
// holds at most RingBlocks() of them), so an even split would waste most of a
// Gemma-3-style budget on rings. Instead every full group gets the same count
// N, and each sliding group gets min(N, RingBlocks * max_num_seqs): enough
// rings for max_num_seqs running sequences. N is the largest count that fits.
// A model with only sliding groups gives each of them N blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cache/model_cache_spec.h"
#include "util/status.h"

namespace agentkv::cache {

// Bytes for KV: `kv_memory_bytes` (--kv-memory) if given, else `fraction` of
// the free memory the caller measured on the device.
uint64_t KvBudgetBytes(std::optional<uint64_t> kv_memory_bytes, uint64_t free_memory_bytes,
                       double fraction = 0.85);

// Blocks per group (indexed like spec.groups). ResourceExhausted if the budget
// cannot hold one block of each full group and one ring of each sliding group;
// InvalidArgument for a spec without groups or a bad block_size/max_num_seqs.
Result<std::vector<int32_t>> BlocksForBudget(const ModelCacheSpec& spec, int block_size,
                                             uint64_t budget_bytes, int32_t max_num_seqs = 256);

}  // namespace agentkv::cache
