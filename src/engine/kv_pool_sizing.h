// How big an engine's KV pool is: given in blocks, in bytes, or (the default)
// a share of the memory left once the model is loaded.
//
// The default measures rather than estimates: it allocates the smallest pool
// the model can run with, reserves the step workspaces (and, on a GPU,
// captures the decode graphs) as the engine will, reads the memory that is
// still free, and gives the pool a share of that plus the probe's own bytes.
// So weights, workspaces and graphs are all accounted for, whatever the
// backend needs for them. The caller then allocates the real pool and
// reserves again (graphs are recaptured for the new pool).
//
// Thread-safety: the backend's (its engine thread, or before it starts).
#pragma once

#include <cstdint>
#include <vector>

#include "cache/model_cache_spec.h"
#include "engine/backend/backend.h"
#include "util/status.h"

namespace agentkv::engine {

struct KvPoolSize {
  std::vector<int32_t> blocks_per_group;  // given: used as is
  uint64_t bytes = 0;                     // else this many bytes, if > 0
  double fraction = 0;                    // else this share of free memory (0: the backend's)
};

// The smallest pool a model runs with: one block of each full-attention
// group, one ring of each sliding group.
std::vector<int32_t> MinimumBlocks(const cache::ModelCacheSpec& spec, int block_size);

// Bytes of a pool of `blocks` (per group).
uint64_t PoolBytes(const cache::ModelCacheSpec& spec, int block_size,
                   const std::vector<int32_t>& blocks);

// The most tokens one sequence can hold in a pool of `blocks`: every
// full-attention group's blocks; sliding groups are rings and never limit it.
// `max_context` when the model has no full-attention group.
int64_t SequenceCapacity(const cache::ModelCacheSpec& spec, int block_size,
                         const std::vector<int32_t>& blocks, int64_t max_context);

// Blocks per group for `size` (see KvPoolSize). May allocate a probe pool
// and Reserve(max_step_tokens, max_batch) on `backend` to measure; the
// caller allocates the returned pool afterwards. ResourceExhausted when the
// memory cannot hold the smallest pool; InvalidArgument for a bad fraction.
Result<std::vector<int32_t>> SizeKvPool(backend::Backend& backend, int block_size,
                                        const KvPoolSize& size, int max_step_tokens, int max_batch);

}  // namespace agentkv::engine
