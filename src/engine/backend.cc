#include "engine/backend.h"

#include <algorithm>
#include <string>

namespace agentkv {

Status CheckSteps(std::span<const SeqStep> batch, const ModelConfig& config,
                  const ModelCacheSpec& spec, const KvLayout& layout) {
  const int bs = layout.block_size;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqStep& st = batch[s];
    if (st.tokens.empty() || st.start_pos < 0)
      return InvalidArgument("Forward: sequence " + std::to_string(s) + " has no new tokens");
    for (int32_t t : st.tokens)
      if (t < 0 || t >= config.vocab_size)
        return InvalidArgument("Forward: token id " + std::to_string(t) + " out of range");
    const int64_t end = static_cast<int64_t>(st.start_pos) + st.tokens.size();
    for (size_t g = 0; g < spec.groups.size(); ++g) {
      const int ring = spec.RingBlocks(static_cast<int>(g), bs);
      const int64_t need =
          ring > 0 ? std::min<int64_t>(ring, (end + bs - 1) / bs) : (end + bs - 1) / bs;
      if (static_cast<int64_t>(st.block_tables[g].size()) < need)
        return InvalidArgument("Forward: sequence " + std::to_string(s) + " block table of group " +
                               std::to_string(g) + " holds " +
                               std::to_string(st.block_tables[g].size()) + " blocks, needs " +
                               std::to_string(need));
      for (int64_t i = 0; i < need; ++i) {
        const int32_t b = st.block_tables[g][i];
        if (b < 0 || b >= layout.blocks_per_group[g])
          return InvalidArgument("Forward: block id " + std::to_string(b) + " out of range");
      }
    }
  }
  return Status::Ok();
}

}  // namespace agentkv
