#include "engine/restore_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace agentkv {

RestorePlan PlanRestore(const RestoreRates& rates) {
  RestorePlan plan;
  const int64_t n = std::max<int64_t>(0, rates.prefix_blocks);
  if (n == 0) return plan;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double busy = std::max(1.0, rates.gpu_busy_factor);
  // Seconds per block of each way.
  const double compute =
      rates.prefill_tokens_per_s > 0 ? busy * rates.block_size / rates.prefill_tokens_per_s : kInf;
  const double load = rates.tier_bytes_per_s > 0
                          ? static_cast<double>(rates.bytes_per_block) / rates.tier_bytes_per_s
                          : kInf;
  auto cost = [&](int64_t r) {
    const double c = r > 0 ? static_cast<double>(r) * compute : 0;
    const double l = r < n ? static_cast<double>(n - r) * load : 0;
    return std::max(c, l);
  };
  plan.recompute_all_seconds = cost(n);
  plan.load_all_seconds = cost(0);
  if (!std::isfinite(load)) {  // nothing can come from the tier
    plan.recompute_blocks = n;
    plan.seconds = plan.recompute_all_seconds;
    return plan;
  }
  // Both finish together at r = n * load / (compute + load); the best whole
  // split is next to it. The pure strategies are candidates too; ties go to
  // fewer recomputed blocks (they leave the device to other agents).
  std::vector<int64_t> candidates = {0, n};
  if (std::isfinite(compute) && std::isfinite(load) && compute + load > 0) {
    const double r = static_cast<double>(n) * load / (compute + load);
    candidates.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::floor(r)), 0, n));
    candidates.push_back(std::clamp<int64_t>(static_cast<int64_t>(std::ceil(r)), 0, n));
  }
  std::sort(candidates.begin(), candidates.end());
  int64_t best = candidates.front();
  for (int64_t r : candidates)
    if (cost(r) < cost(best)) best = r;
  plan.recompute_blocks = best;
  plan.load_blocks = n - best;
  plan.seconds = cost(best);
  return plan;
}

}  // namespace agentkv
