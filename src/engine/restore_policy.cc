#include "engine/restore_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace agentkv::engine {

double PrefillCost::Seconds(int64_t from, int64_t to) const {
  if (to <= from) return 0;
  const double a = static_cast<double>(from), b = static_cast<double>(to);
  return seconds_per_token * (b - a) + seconds_per_token_context * (b * b - a * a) / 2;
}

PrefillCost PrefillCost::FromTimings(int64_t chunk, double seconds_at_0, int64_t pos,
                                     double seconds_at_pos) {
  PrefillCost c;
  if (chunk <= 0 || pos <= 0 || !(seconds_at_0 > 0) || !(seconds_at_pos > 0) ||
      !std::isfinite(seconds_at_0) || !std::isfinite(seconds_at_pos))
    return c;
  const double n = static_cast<double>(chunk);
  // t(pos) - t(0) = c1 * n * pos: the chunk's tokens each see pos more.
  c.seconds_per_token_context =
      std::max(0.0, (seconds_at_pos - seconds_at_0) / (n * static_cast<double>(pos)));
  c.seconds_per_token =
      std::max(seconds_at_0 / n - c.seconds_per_token_context * n / 2, seconds_at_0 / n / 2);
  return c;
}

RestorePlan PlanRestore(const RestoreRates& rates) {
  RestorePlan plan;
  const int64_t n = std::max<int64_t>(0, rates.prefix_blocks);
  if (n == 0) return plan;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double busy = std::max(1.0, rates.gpu_busy_factor);
  const int64_t bs = rates.block_size;
  const int64_t a = std::max<int64_t>(0, rates.cached_blocks) * bs;
  const double load = rates.tier_bytes_per_s > 0
                          ? static_cast<double>(rates.bytes_per_block) / rates.tier_bytes_per_s
                          : kInf;
  auto compute = [&](int64_t r) {
    if (r <= 0) return 0.0;
    return rates.prefill.known() ? busy * rates.prefill.Seconds(a, a + r * bs) : kInf;
  };
  const double latency = std::max(0.0, rates.tier_latency_s);
  auto loading = [&](int64_t r) {
    return r < n ? latency + static_cast<double>(n - r) * load : 0.0;
  };
  auto cost = [&](int64_t r) { return std::max(compute(r), loading(r)); };
  plan.recompute_all_seconds = cost(n);
  plan.load_all_seconds = cost(0);
  if (!std::isfinite(load)) {  // nothing can come from the tier
    plan.recompute_blocks = n;
    plan.seconds = plan.recompute_all_seconds;
    return plan;
  }
  // Recomputing grows with r and loading shrinks: the best split is where
  // they cross (the first r at which recomputing takes at least as long),
  // or the block before it. The pure strategies are candidates too; ties go
  // to fewer recomputed blocks (they leave the device to other agents).
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (compute(mid) >= loading(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const std::vector<int64_t> candidates = {0, std::max<int64_t>(0, lo - 1), lo, n};
  int64_t best = 0;
  for (int64_t r : candidates)
    if (cost(r) < cost(best)) best = r;
  plan.recompute_blocks = best;
  plan.load_blocks = n - best;
  plan.seconds = cost(best);
  return plan;
}

}  // namespace agentkv::engine
