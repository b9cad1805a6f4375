// PlanRestore: how to get a returning agent's prefix back onto the device
// when its blocks are in a slower tier (the store): recompute a head of the
// prefix by prefill while the rest of it streams in from the tier, split so
// that both finish together (compute and copy run at once, on different
// engines of the device and the loader's threads). Pure: the caller
// measures the rates (Engine calibrates prefill at start-up; the tier's
// rate comes from its loads).
//
// Model: recomputing blocks [a, a + r) after `a` cached blocks takes
// PrefillCost::Seconds over those tokens (a per-token cost plus attention,
// which grows with the position), stretched by the busy factor (the
// device's time is shared with other agents, and what the recompute takes
// from them counts too); loading the other n - r blocks takes the tier's
// latency plus (n - r) * bytes_per_block / tier rate. The plan takes the max of the two;
// it is never slower than the better pure strategy (load everything, or
// recompute everything), since both are among the candidates. On a CPU,
// where prefill is slow and memory copies fast, it loads everything.
#pragma once

#include <cstddef>
#include <cstdint>

namespace agentkv::engine {

// What prefill costs on this device and model: seconds per token, plus
// seconds per token per token of context before it (attention).
struct PrefillCost {
  double seconds_per_token = 0;
  double seconds_per_token_context = 0;
  // Unknown until measured: then nothing is recomputed by choice.
  bool known() const { return seconds_per_token > 0; }
  // Seconds to prefill tokens [from, to) after [0, from) cached.
  double Seconds(int64_t from, int64_t to) const;
  // From two timed prefill chunks of `chunk` tokens, one at position 0 and
  // one after `pos` cached tokens. Unknown for unusable timings; the
  // context term is never negative.
  static PrefillCost FromTimings(int64_t chunk, double seconds_at_0, int64_t pos,
                                 double seconds_at_pos);
};

struct RestoreRates {
  int64_t cached_blocks = 0;  // whole blocks before the prefix, already in the pool
  int64_t prefix_blocks = 0;  // whole blocks the tier holds for this request
  int block_size = 16;
  PrefillCost prefill;  // unknown: load everything
  // Bytes per second the tier delivers into the pool (decode included for
  // the store). <= 0: unusable (recompute everything).
  double tier_bytes_per_s = 0;
  // Seconds before the tier's first block arrives (index lookups, the
  // first reads from a cold disk), paid once per load.
  double tier_latency_s = 0;
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

}  // namespace agentkv::engine
