// Scheduler: which sequences run in the next step and with how many tokens.
//
// Waiting requests are ordered by key = priority level (HIGH 0, NORMAL 1,
// LOW 2) + aging * arrival time in seconds, ties by arrival. Since every
// waiting request ages at the same rate, that static key is the same order as
// "effective priority = level - aging * seconds waited": with the default
// 0.1/s a LOW request ranks with a NORMAL one that arrived 10 s later, and a
// LOW request waits at most (2 / aging) s behind HIGH arrivals that came
// after it. FIFO within equal keys; no starvation.
//
// A step: every running sequence that is decoding gets one token (plus its
// draft, Sequence::draft, as far as the budget and its blocks allow); the rest
// of the per-step token budget goes to prefill chunks of running sequences,
// then to admitting waiting ones (prefix-cache hits attached first), up to
// max_batch running. When blocks run out for a decode token, the worst
// running sequence (highest key, latest arrival) is preempted: its blocks are
// freed and it goes back to the waiting queue with its tokens so far, to be
// recomputed; its sampler and stop state carry on, so its output is the same
// as if it had never been preempted. Its full blocks stay in the prefix
// cache (and what the pool evicts goes to the host tier), and before it is
// admitted again the readmit hook may bring evicted ones back, so that
// little is recomputed. Sequences on hold (Sequence::hold) are
// not scheduled, and a sequence with a prefill limit (Sequence::
// prefill_limit: a split restore brings the rest of its prompt) prefills
// up to it and then waits, running, until the limit is cleared.
//
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "engine/sequence.h"

namespace agentkv::engine {

struct SchedulerOptions {
  int max_batch = 64;          // running sequences
  int max_step_tokens = 2048;  // tokens per step, prefill and decode together
  double aging_per_second = 0.1;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;  // tokens[computed, computed + num_tokens) run this step
  bool want_logits = false;
  // > 1: a decoding sequence runs its last token and the first
  // logit_rows - 1 tokens of its Sequence::draft (not yet in `tokens`: the
  // engine appends them), with a logits row for each.
  int32_t logit_rows = 1;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<cache::KvBlockCopy> copies;  // the backend does these before the step
  int preempted = 0;
};

class Scheduler {
 public:
  Scheduler(cache::KvCacheManager* kv, SchedulerOptions options);

  // Called with a sequence marked restore_before_admit (preempted ones, and
  // those the engine marks) once it is about to be admitted (there is room),
  // to bring its evicted blocks back into the prefix cache from a slower
  // tier; the mark is then cleared. Null: none.
  void SetAdmitHook(std::function<void(Sequence*)> hook) { admit_hook_ = std::move(hook); }
  // Called with a sequence that Remove takes out while it has a prefill
  // limit (a split restore under way), before its blocks are freed.
  void SetRemoveHook(std::function<void(Sequence*)> hook) { remove_hook_ = std::move(hook); }

  // Queues a new sequence (tokens and prompt_len set) that arrived at
  // `now_s` (seconds on the engine's clock).
  void Add(std::unique_ptr<Sequence> seq, double now_s);
  // Removes a sequence wherever it is and frees its blocks now.
  std::unique_ptr<Sequence> Remove(RequestId id);

  // Plans the next step. Empty when there is nothing to run; `stuck` is set
  // when requests wait but none can be admitted with an empty running set
  // (the head request can never fit in the pool).
  StepPlan Schedule(bool* stuck);
  // After the step ran: the scheduled tokens' KV is in the cache.
  Status Commit(const ScheduledSeq& s);

  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  int64_t preemptions() const { return preemptions_; }
  // The sequence with this id, waiting or running (null if none).
  Sequence* Find(RequestId id) const;
  // The waiting sequence that would be admitted next (null if none).
  Sequence* PeekWaiting() const;
  const std::vector<Sequence*>& running() const { return running_; }

 private:
  struct WaitKey {
    double key;
    uint64_t arrival;
    bool operator<(const WaitKey& o) const {
      return key != o.key ? key < o.key : arrival < o.arrival;
    }
  };
  void Preempt(Sequence* s);
  bool TryAdmit(Sequence* s, int32_t budget, ScheduledSeq* out, StepPlan* plan);
  int32_t AvailableBlocks() const;
  // Tokens the sequence may prefill now (its prefill limit, if any).
  static int64_t PrefillRoom(const Sequence* s);

  cache::KvCacheManager* kv_;
  SchedulerOptions options_;
  uint64_t next_arrival_ = 0;
  std::map<RequestId, std::unique_ptr<Sequence>> all_;
  std::map<WaitKey, Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order
  int64_t preemptions_ = 0;
  std::function<void(Sequence*)> admit_hook_;
  std::function<void(Sequence*)> remove_hook_;
};

}  // namespace agentkv::engine
