// PlanRestore: how to get a returning agent's prefix back onto the device
// when its blocks are in a slower tier (host memory or the store): recompute
// a head of the prefix by prefill while the rest of it streams in from the
// tier, split so that both finish together (compute and copy run at once,
// on different engines of the device). Pure: the caller measures the rates.
//
// Model: recomputing r leading blocks takes r * block_size / prefill rate,
// stretched by the busy factor (the device's time is shared with other
// agents, and what the recompute takes from them counts too); loading the
// other n - r takes (n - r) * bytes_per_block / tier rate. The plan takes
// max of the two; it is never slower than the better pure strategy (load
// everything, or recompute everything), since both are among the
// candidates. On a CPU, where prefill is slow and memory copies fast, it
// loads everything.
//
// The engine does not execute split plans yet: this is the decision only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentkv {

struct RestoreRates {
  int64_t prefix_blocks = 0;  // whole blocks the tier holds for this request
  int block_size = 16;
  // Prefill tokens per second measured at this context length, on this
  // device and model. <= 0: unknown (load everything).
  double prefill_tokens_per_s = 0;
  // Bytes per second the tier holding the blocks delivers into the pool
  // (decode included for the store). <= 0: unusable (recompute everything).
  double tier_bytes_per_s = 0;
  size_t bytes_per_block = 0;
  // >= 1: how much longer a recompute takes (and takes from other agents)
  // than on an idle device. Values below 1 count as 1.
  double gpu_busy_factor = 1;
};

struct RestorePlan {
  int64_t recompute_blocks = 0;  // the head, by prefill
  int64_t load_blocks = 0;       // the rest, from the tier
  double seconds = 0;            // estimated time until both are done
  double recompute_all_seconds = 0;
  double load_all_seconds = 0;
};

RestorePlan PlanRestore(const RestoreRates& rates);

}  // namespace agentkv
