#include "engine/scheduler.h"

#include <algorithm>

namespace agentkv::engine {

Scheduler::Scheduler(cache::KvCacheManager* kv, SchedulerOptions options)
    : kv_(kv), options_(options) {}

void Scheduler::Add(std::unique_ptr<Sequence> seq, double now_s) {
  seq->arrival = next_arrival_++;
  seq->key = static_cast<int>(seq->request.priority) + options_.aging_per_second * now_s;
  Sequence* s = seq.get();
  waiting_.emplace(WaitKey{s->key, s->arrival}, s);
  all_[s->id] = std::move(seq);
}

std::unique_ptr<Sequence> Scheduler::Remove(RequestId id) {
  auto it = all_.find(id);
  if (it == all_.end()) return nullptr;
  Sequence* s = it->second.get();
  if (s->prefill_limit >= 0 && remove_hook_) remove_hook_(s);
  waiting_.erase(WaitKey{s->key, s->arrival});
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  kv_->FreeSequence(id);
  std::unique_ptr<Sequence> out = std::move(it->second);
  all_.erase(it);
  return out;
}

Sequence* Scheduler::Find(RequestId id) const {
  auto it = all_.find(id);
  return it == all_.end() ? nullptr : it->second.get();
}

Sequence* Scheduler::PeekWaiting() const {
  return waiting_.empty() ? nullptr : waiting_.begin()->second;
}

void Scheduler::Preempt(Sequence* s) {
  kv_->FreeSequence(s->id);
  s->draft.clear();
  s->computed = 0;
  s->restore_before_admit = true;
  ++s->preemptions;
  ++preemptions_;
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.emplace(WaitKey{s->key, s->arrival}, s);
}

int64_t Scheduler::PrefillRoom(const Sequence* s) {
  return s->prefill_limit >= 0 ? std::min(s->pending(), s->prefill_limit - s->computed)
                               : s->pending();
}

int32_t Scheduler::AvailableBlocks() const {
  int32_t avail = INT32_MAX;
  for (int g = 0; g < kv_->num_groups(); ++g) avail = std::min(avail, kv_->pool(g).NumAvailable());
  return avail;
}

bool Scheduler::TryAdmit(Sequence* s, int32_t budget, ScheduledSeq* out, StepPlan* plan) {
  if (!kv_->AddSequence(s->id, s->cache_root).ok()) return false;
  auto attached = kv_->AttachCachedPrefix(s->id, s->tokens);
  s->computed = attached.ok() ? *attached : 0;
  // Admit only with room for the whole prompt plus one block of headroom per
  // running sequence, so that admissions do not force preemptions at once.
  const int64_t total = static_cast<int64_t>(s->tokens.size());
  for (int g = 0; g < kv_->num_groups(); ++g) {
    const int64_t need = kv_->NewBlocksNeeded(s->id, total, g);
    if (need + static_cast<int64_t>(running_.size()) > kv_->pool(g).NumAvailable()) {
      kv_->FreeSequence(s->id);
      s->computed = 0;
      return false;
    }
  }
  // A marked sequence (preempted, say) that will be admitted: the hook
  // brings back what the pool evicted of it, and the prefix is attached
  // again. (Restored
  // blocks come out of the available ones and are attached: the room
  // checked above does not change.)
  if (s->restore_before_admit) {
    s->restore_before_admit = false;
    if (admit_hook_) {
      kv_->FreeSequence(s->id);
      admit_hook_(s);
      if (!kv_->AddSequence(s->id, s->cache_root).ok()) return false;
      attached = kv_->AttachCachedPrefix(s->id, s->tokens);
      s->computed = attached.ok() ? *attached : 0;
    }
  }
  if (!s->admitted_once) s->cached_prompt_tokens = s->computed;
  // Up to a split restore's limit; at it, admitted with nothing to run.
  const int32_t n =
      static_cast<int32_t>(std::max<int64_t>(0, std::min<int64_t>(PrefillRoom(s), budget)));
  if (!kv_->EnsureCapacity(s->id, s->computed + n, &plan->copies).ok()) {
    kv_->FreeSequence(s->id);
    s->computed = 0;
    return false;
  }
  s->admitted_once = true;
  *out = ScheduledSeq{s, n, s->computed + n == total};
  return true;
}

StepPlan Scheduler::Schedule(bool* stuck) {
  StepPlan plan;
  *stuck = false;
  int32_t budget = options_.max_step_tokens;
  auto better = [](const Sequence* a, const Sequence* b) {
    return a->key != b->key ? a->key < b->key : a->arrival < b->arrival;
  };
  std::vector<Sequence*> order = running_;
  std::sort(order.begin(), order.end(), better);

  // 1. One token for every decoding sequence, preempting the worst on need.
  for (Sequence* s : order) {
    if (s->pending() != 1 || budget <= 0 || s->hold || PrefillRoom(s) <= 0) continue;
    if (std::find(running_.begin(), running_.end(), s) == running_.end()) continue;
    // The draft only where the budget and free blocks allow (never a
    // preemption for it).
    const int32_t n =
        1 + static_cast<int32_t>(std::min<int64_t>(s->draft.size(), std::max(budget - 1, 0)));
    if (n > 1 && kv_->EnsureCapacity(s->id, s->computed + n, &plan.copies).ok()) {
      plan.seqs.push_back(ScheduledSeq{s, n, true, n});
      budget -= n;
      continue;
    }
    while (true) {
      Status st = kv_->EnsureCapacity(s->id, s->computed + 1, &plan.copies);
      if (st.ok()) {
        plan.seqs.push_back(ScheduledSeq{s, 1, true});
        --budget;
        break;
      }
      Sequence* victim = *std::max_element(running_.begin(), running_.end(), better);
      Preempt(victim);
      ++plan.preempted;
      if (victim == s) break;
    }
  }
  // 2. Prefill chunks of running sequences.
  for (Sequence* s : order) {
    if (s->pending() <= 1 || budget <= 0 || s->hold || PrefillRoom(s) <= 0) continue;
    if (std::find(running_.begin(), running_.end(), s) == running_.end()) continue;
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(PrefillRoom(s), budget));
    if (!kv_->EnsureCapacity(s->id, s->computed + n, &plan.copies).ok()) continue;
    plan.seqs.push_back(
        ScheduledSeq{s, n, s->computed + n == static_cast<int64_t>(s->tokens.size())});
    budget -= n;
  }
  // 3. Admit waiting sequences in key order; the head blocks the rest.
  while (static_cast<int>(running_.size()) < options_.max_batch && budget > 0 &&
         !waiting_.empty()) {
    Sequence* s = waiting_.begin()->second;
    ScheduledSeq sched;
    if (!TryAdmit(s, budget, &sched, &plan)) break;
    waiting_.erase(waiting_.begin());
    running_.push_back(s);
    if (sched.num_tokens > 0) plan.seqs.push_back(sched);
    budget -= sched.num_tokens;
  }
  *stuck = plan.seqs.empty() && running_.empty() && !waiting_.empty();
  return plan;
}

Status Scheduler::Commit(const ScheduledSeq& s) {
  Sequence* q = s.seq;
  RETURN_IF_ERROR(kv_->CommitTokens(
      q->id, std::span<const int32_t>(q->tokens).subspan(q->computed, s.num_tokens)));
  q->computed += s.num_tokens;
  return Status::Ok();
}

}  // namespace agentkv::engine
