// BlockRuns: a list of pool block ids cut into runs of consecutive ids, so
// that copying blocks i..j of a request to or from a contiguous host buffer
// is one copy per run instead of one per block. Pure, tested without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace agentkv::backend::cuda {

struct BlockRun {
  int32_t first_block = 0;  // pool id of the run's first block
  int32_t first_index = 0;  // its index in the request (and the host buffer)
  int32_t count = 0;
};

// Appends to `out` the runs of `blocks` in order: blocks[k + 1] ==
// blocks[k] + 1 continues a run.
inline void BlockRuns(std::span<const int32_t> blocks, std::vector<BlockRun>* out) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!out->empty()) {
      BlockRun& r = out->back();
      if (r.first_index + r.count == static_cast<int32_t>(i) &&
          r.first_block + r.count == blocks[i]) {
        ++r.count;
        continue;
      }
    }
    out->push_back(BlockRun{blocks[i], static_cast<int32_t>(i), 1});
  }
}

}  // namespace agentkv::backend::cuda
