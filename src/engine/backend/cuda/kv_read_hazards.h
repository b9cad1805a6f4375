// KvReadHazards: which asynchronous reads of KV blocks (device -> host, on
// their own stream) a write to the pool must wait for.
//
// Reads of finished turns' blocks (for the host tier and the store) run on a
// copy stream beside the compute stream, so that a gigabyte of them does not
// queue in front of the next steps. A read starts after everything already
// on the compute stream (it waits on an event recorded there), so it sees
// the blocks as the steps left them. The other direction is this class: a
// later write into a block whose read has not finished (a step writing its
// new tokens, a block copy, a restore) must first wait for that read's
// event. Reads finish in ticket order (one stream), so waiting for the
// largest pending ticket among the written blocks covers them all.
//
// Pure bookkeeping, no CUDA: tested without a GPU. Thread-safety: none (the
// engine thread owns the backend).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace agentkv::backend::cuda {

class KvReadHazards {
 public:
  // `blocks_per_group[g]`: the pool's block count of group g.
  explicit KvReadHazards(std::span<const int32_t> blocks_per_group) {
    last_read_.reserve(blocks_per_group.size());
    for (int32_t n : blocks_per_group) last_read_.emplace_back(static_cast<size_t>(n), 0);
  }

  // Blocks `blocks` of `group` are being read by read `ticket` (increasing).
  void NoteRead(int group, std::span<const int32_t> blocks, uint64_t ticket) {
    std::vector<uint64_t>& last = last_read_[static_cast<size_t>(group)];
    for (int32_t b : blocks) last[static_cast<size_t>(b)] = ticket;
  }

  // The largest ticket above `done` (every ticket up to `done` is known to
  // be complete) among the reads of `blocks`; 0 when none is pending.
  uint64_t PendingFor(int group, std::span<const int32_t> blocks, uint64_t done) const {
    const std::vector<uint64_t>& last = last_read_[static_cast<size_t>(group)];
    uint64_t wait = 0;
    for (int32_t b : blocks) {
      const uint64_t t = last[static_cast<size_t>(b)];
      if (t > done) wait = std::max(wait, t);
    }
    return wait;
  }

  // The blocks of a sequence's table that a step writing positions
  // [start, end) stores into: the blocks covering them, or, for a ring
  // (`ring` > 0 blocks, positions wrapping), every block of the ring, since
  // rings are small and never read for the tiers.
  static void WrittenBlocks(std::span<const int32_t> table, int64_t start, int64_t end,
                            int block_size, int ring, std::vector<int32_t>* out) {
    if (end <= start) return;
    if (ring > 0) {
      out->insert(out->end(), table.begin(), table.end());
      return;
    }
    const int64_t first = start / block_size, last = (end - 1) / block_size;
    for (int64_t i = first; i <= last && i < static_cast<int64_t>(table.size()); ++i)
      out->push_back(table[static_cast<size_t>(i)]);
  }

 private:
  // Per group, per block: the ticket of the last read started (0: none).
  std::vector<std::vector<uint64_t>> last_read_;
};

}  // namespace agentkv::backend::cuda
