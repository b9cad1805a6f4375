// GroupCommitter: many small durable writes from many threads share one LMDB
// write transaction and one fsync (leader/follower group commit). A caller
// queues its request; whoever finds no commit under way becomes the leader,
// takes every request queued so far, applies them all in one transaction
// and commits; the others wait for their result. With 64 agents finishing a
// turn together that is a few fsyncs instead of 64 in a row.
//
// Each request's `apply` may run more than once (the map grows and the
// transaction reruns; or its group failed and it is retried alone), always
// from scratch inside a fresh transaction, so it must have no effects
// outside the transaction that a rerun would duplicate. When a group's
// transaction fails, every request in it is retried in a transaction of its
// own, so one bad request fails only itself.
//
// Thread-safety: Commit may be called from any thread; it blocks until the
// request is committed (durable when the environment syncs) or failed.
// Borrows the environment, which must outlive it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "store/lmdb_env.h"
#include "util/status.h"

namespace agentkv::store {

class GroupCommitter {
 public:
  struct Stats {
    uint64_t requests = 0;
    uint64_t transactions = 0;  // committed groups, solo retries included
    double wait_seconds = 0;    // summed over requests: Commit call to return
    double max_wait_seconds = 0;
  };

  explicit GroupCommitter(LmdbEnv* env) : env_(env) {}

  Status Commit(const std::function<Status(LmdbEnv::WriteTxn&)>& apply);

  // Requests queued or being committed now. The KV writer defers its large
  // transactions while this is non-zero, so that a turn's history does not
  // wait behind megabytes of cache.
  int busy() const { return busy_.load(std::memory_order_relaxed); }
  Stats stats() const;

 private:
  struct Request {
    const std::function<Status(LmdbEnv::WriteTxn&)>* apply;
    Status status;
    bool done = false;
  };
  void CommitGroup(const std::deque<Request*>& group);

  LmdbEnv* env_;
  std::atomic<int> busy_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request*> queue_;
  bool leading_ = false;
  Stats stats_;
};

}  // namespace agentkv::store
