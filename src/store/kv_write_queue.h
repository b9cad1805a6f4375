// KvWriteQueue: the bounded queue between PutKvBlocks() callers and the
// store's writer thread. Push never blocks on I/O; when the queued KV bytes
// would exceed the bound, the oldest pending writes are dropped (KV is a
// cache) and counted.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "store/fingerprint.h"
#include "util/shared_bytes.h"

namespace agentkv::store {

// One KV block to persist: its chained hash, its token ids and the KV bytes
// (opaque to the store). Empty `data` links an agent's chain to a block
// that is already stored (e.g. a shared system prompt) without rewriting it.
struct KvBlockWrite {
  cache::BlockHash hash;
  std::vector<int32_t> tokens;
  SharedBytes data;
};

// Blocks [first_index, first_index + blocks.size()) of `agent_id`'s chain
// under `fp`. The chain is cut after the last block written (a chain is one
// sequence; entries past it belonged to a history that diverged). An empty
// agent id stores the blocks without a chain. `element_size` (1, 2 or 4)
// selects the byte shuffle before compression: 2 for bf16/fp16 KV, 4 for
// fp32.
struct KvChainWrite {
  std::string agent_id;
  ModelFingerprint fp;
  uint32_t first_index = 0;
  uint32_t element_size = 2;
  std::vector<KvBlockWrite> blocks;
  // Only refresh the LRU time of these blocks (a resume read them).
  bool touch_only = false;

  size_t bytes() const;
};

class KvWriteQueue {
 public:
  explicit KvWriteQueue(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Enqueues `w`, first dropping the oldest pending writes while the total
  // would exceed the bound (a single write larger than the bound is still
  // taken once the queue is empty). Returns false after Close().
  bool Push(KvChainWrite w);
  // Waits for work; moves writes totalling up to `max_batch_bytes` (at least
  // one) into `out`. Returns false once closed and empty.
  bool PopBatch(size_t max_batch_bytes, std::vector<KvChainWrite>* out);
  // The writer finished the batch it popped last.
  void MarkDone();
  // Waits until every write pushed before the call is written or dropped.
  void WaitResolved();
  void Close();

  struct Stats {
    uint64_t pending_writes = 0;
    uint64_t pending_bytes = 0;
    uint64_t dropped_writes = 0;
    uint64_t dropped_bytes = 0;
  };
  Stats stats() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable resolved_cv_;
  struct Item {
    uint64_t seq;
    size_t bytes;
    KvChainWrite write;
  };
  std::deque<Item> queue_;
  size_t queued_bytes_ = 0;
  uint64_t next_seq_ = 1;
  // Sequence number of the first write of the batch the writer holds, 0 if none.
  uint64_t in_flight_seq_ = 0;
  uint64_t dropped_writes_ = 0;
  uint64_t dropped_bytes_ = 0;
  bool closed_ = false;
};

}  // namespace agentkv::store
