// Scheduler policy on the real KvCacheManager (no backend): aging bounds,
// FIFO, token budgets, preemption and admission.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

namespace agentkv::engine {
namespace {

cache::ModelCacheSpec Spec() {
  cache::ModelCacheSpec s;
  s.num_layers = 2;
  s.num_kv_heads = 1;
  s.head_dim = 4;
  s.layer_kinds = {cache::AttentionKind::kFull, cache::AttentionKind::kFull};
  s.layer_windows = {0, 0};
  s.BuildGroups();
  return s;
}

struct Fixture {
  std::unique_ptr<cache::KvCacheManager> kv;
  std::unique_ptr<Scheduler> sched;
  RequestId next = 1;
  Fixture(int blocks, SchedulerOptions o, int bs = 4) {
    cache::KvCacheConfig c;
    c.block_size = bs;
    c.blocks_per_group = {blocks};
    kv = std::move(cache::KvCacheManager::Create(Spec(), c).value());
    sched = std::make_unique<Scheduler>(kv.get(), o);
  }
  RequestId Add(Priority p, int prompt_len, double now, int first_token = 0) {
    auto s = std::make_unique<Sequence>();
    s->id = next++;
    s->request.priority = p;
    for (int i = 0; i < prompt_len; ++i) s->tokens.push_back(first_token + i);
    s->prompt_len = s->tokens.size();
    const RequestId id = s->id;
    sched->Add(std::move(s), now);
    return id;
  }
};

// One admission per step (max_batch 1); every admitted request finishes in
// that step; a HIGH request arrives every second. Returns the second at which
// the LOW request (arrived at 0) ran, or -1.
int LowStartUnderHighStream(double aging) {
  SchedulerOptions o;
  o.max_batch = 1;
  o.aging_per_second = aging;
  Fixture f(64, o);
  const RequestId low = f.Add(Priority::kLow, 3, 0.0);
  f.Add(Priority::kHigh, 3, 0.0);
  for (int t = 1; t < 200; ++t) {
    f.Add(Priority::kHigh, 3, t);
    bool stuck;
    StepPlan p = f.sched->Schedule(&stuck);
    EXPECT_EQ(p.seqs.size(), 1u);
    const RequestId ran = p.seqs[0].seq->id;
    f.sched->Remove(ran);
    if (ran == low) return t;
  }
  return -1;
}

TEST(SchedulerTest, LowRequestStartsWithinAgingBound) {
  // Default aging 0.1/s: LOW (level 2) ranks with HIGH (level 0) arrivals 20 s
  // younger, so it runs right after the HIGH requests of its first 20 s.
  const int t = LowStartUnderHighStream(0.1);
  ASSERT_GT(t, 0);
  EXPECT_LE(t, 2 / 0.1 + 2);
  EXPECT_GE(t, 2 / 0.1 - 1);  // and not before the HIGHs that outrank it
  // Without aging it would starve.
  EXPECT_EQ(LowStartUnderHighStream(0.0), -1);
}

TEST(SchedulerTest, FifoWithinEqualPriority) {
  SchedulerOptions o;
  o.max_batch = 1;
  Fixture f(64, o);
  std::vector<RequestId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(f.Add(Priority::kNormal, 2, 1.0));
  for (int i = 0; i < 5; ++i) {
    bool stuck;
    StepPlan p = f.sched->Schedule(&stuck);
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].seq->id, ids[i]);
    f.sched->Remove(ids[i]);
  }
}

TEST(SchedulerTest, DecodeFirstThenChunkedPrefillUnderBudget) {
  SchedulerOptions o;
  o.max_batch = 8;
  o.max_step_tokens = 10;
  Fixture f(64, o);
  const RequestId a = f.Add(Priority::kNormal, 4, 0);
  bool stuck;
  StepPlan p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_tokens, 4);
  EXPECT_TRUE(p.seqs[0].want_logits);
  ASSERT_TRUE(f.sched->Commit(p.seqs[0]).ok());
  p.seqs[0].seq->tokens.push_back(99);  // sampled
  f.Add(Priority::kNormal, 25, 0);      // longer than the budget
  p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].seq->id, a);
  EXPECT_EQ(p.seqs[0].num_tokens, 1);
  EXPECT_EQ(p.seqs[1].num_tokens, 9);  // the rest of the budget
  EXPECT_FALSE(p.seqs[1].want_logits);
  int total = 0;
  for (auto& s : p.seqs) total += s.num_tokens;
  EXPECT_LE(total, o.max_step_tokens);
}

TEST(SchedulerTest, PreemptsWorstWhenBlocksRunOut) {
  SchedulerOptions o;
  o.max_batch = 4;
  Fixture f(4, o);  // 4 blocks of 4 tokens
  const RequestId a = f.Add(Priority::kHigh, 4, 0);
  const RequestId b = f.Add(Priority::kLow, 3, 0);
  bool stuck;
  StepPlan p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 2u);
  for (auto& s : p.seqs) {
    ASSERT_TRUE(f.sched->Commit(s).ok());
    s.seq->tokens.push_back(1);
  }
  // Grow both until the pool is exhausted; the LOW one must be preempted
  // while the HIGH one keeps running.
  bool preempted = false;
  for (int step = 0; step < 12 && !preempted; ++step) {
    p = f.sched->Schedule(&stuck);
    preempted = p.preempted > 0;
    for (auto& s : p.seqs) {
      EXPECT_NE(preempted ? s.seq->id : -1, b);
      ASSERT_TRUE(f.sched->Commit(s).ok());
      s.seq->tokens.push_back(2);
    }
  }
  EXPECT_TRUE(preempted);
  EXPECT_EQ(f.sched->num_waiting(), 1u);
  EXPECT_EQ(f.sched->PeekWaiting()->id, b);
  EXPECT_TRUE(f.sched->PeekWaiting()->restore_before_admit);
  EXPECT_EQ(f.sched->PeekWaiting()->computed, 0);
  EXPECT_GT(f.kv->NumTokens(a), 0);
  ASSERT_TRUE(f.kv->CheckInvariants().ok());
}

// The admit hook runs for a marked sequence only once it is about to be
// admitted (never on an attempt that finds no room), and once per mark;
// preemption marks a sequence again.
TEST(SchedulerTest, AdmitHookRunsOncePerMarkWhenThereIsRoom) {
  SchedulerOptions o;
  o.max_batch = 4;
  Fixture f(4, o);  // 4 blocks of 4 tokens
  std::vector<RequestId> hooked;
  f.sched->SetAdmitHook([&](Sequence* s) { hooked.push_back(s->id); });
  const RequestId big = f.Add(Priority::kHigh, 13, 0);  // 4 blocks: the pool
  const RequestId marked = f.Add(Priority::kNormal, 5, 0);
  f.sched->Find(marked)->restore_before_admit = true;
  bool stuck;
  StepPlan p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq->id, big);
  EXPECT_TRUE(hooked.empty());  // no room for `marked`: not called
  EXPECT_TRUE(f.sched->Find(marked)->restore_before_admit);
  f.sched->Remove(big);
  p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(hooked, std::vector<RequestId>{marked});
  EXPECT_FALSE(f.sched->Find(marked)->restore_before_admit);
  // Unmarked admissions and later steps do not call it.
  f.Add(Priority::kNormal, 3, 1);
  for (auto& s : p.seqs) ASSERT_TRUE(f.sched->Commit(s).ok());
  p = f.sched->Schedule(&stuck);
  EXPECT_EQ(hooked.size(), 1u);
  ASSERT_TRUE(f.kv->CheckInvariants().ok());
}

TEST(SchedulerTest, RemoveFreesBlocksAtOnce) {
  SchedulerOptions o;
  Fixture f(16, o);
  const RequestId a = f.Add(Priority::kNormal, 10, 0, 100);
  bool stuck;
  StepPlan p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 1u);
  ASSERT_TRUE(f.sched->Commit(p.seqs[0]).ok());
  EXPECT_LT(f.kv->pool(0).Stats().free, 16);
  f.sched->Remove(a);
  const cache::BlockPoolStats st = f.kv->pool(0).Stats();
  EXPECT_EQ(st.in_use, 0);
  EXPECT_EQ(st.free + st.cached + st.pinned, 16);
  EXPECT_FALSE(f.sched->HasWork());
}

TEST(SchedulerTest, StuckWhenRequestCanNeverFit) {
  SchedulerOptions o;
  Fixture f(2, o);  // 8 tokens at most
  f.Add(Priority::kNormal, 20, 0);
  bool stuck;
  StepPlan p = f.sched->Schedule(&stuck);
  EXPECT_TRUE(p.seqs.empty());
  EXPECT_TRUE(stuck);
}

// A sequence on hold (its pick in flight ends it) gets no token; Find sees
// running and waiting sequences alike.
TEST(SchedulerTest, HeldSequencesAreNotScheduledAndFindSeesAll) {
  SchedulerOptions o;
  o.max_batch = 1;
  Fixture f(64, o);
  const RequestId a = f.Add(Priority::kNormal, 5, 0.0);
  const RequestId b = f.Add(Priority::kNormal, 5, 0.0);
  bool stuck;
  StepPlan p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 1u);
  ASSERT_TRUE(f.sched->Commit(p.seqs[0]).ok());
  Sequence* s = f.sched->Find(a);
  ASSERT_EQ(s, p.seqs[0].seq);
  ASSERT_NE(f.sched->Find(b), nullptr);  // waiting
  EXPECT_EQ(f.sched->Find(999), nullptr);
  s->tokens.push_back(7);  // decoding: one token pending
  s->hold = true;
  EXPECT_TRUE(f.sched->Schedule(&stuck).seqs.empty());
  s->hold = false;
  p = f.sched->Schedule(&stuck);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq->id, a);
}

}  // namespace
}  // namespace agentkv::engine

namespace agentkv::engine {
namespace {

// A decoding sequence's draft runs with it (one logits row per token) when
// the budget and free blocks allow; otherwise it is cut to the budget, or
// dropped without preempting anyone for it.
TEST(SchedulerTest, DraftsRunWithinTheBudgetAndFreeBlocksOnly) {
  for (int step_tokens : {64, 3}) {
    SchedulerOptions o;
    o.max_step_tokens = step_tokens;
    Fixture f(3, o);  // 12 tokens of KV
    const RequestId id = f.Add(Priority::kNormal, 3, 0.0);
    bool stuck;
    StepPlan p = f.sched->Schedule(&stuck);
    ASSERT_EQ(p.seqs.size(), 1u);
    ASSERT_TRUE(f.sched->Commit(p.seqs[0]).ok());
    Sequence* s = f.sched->Find(id);
    s->tokens.push_back(50);  // the first output token: decoding now
    // 3 + 1 + 9 = 13 tokens: no room for all of it (dropped); cut to a
    // budget of 3 tokens it fits.
    s->draft = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    p = f.sched->Schedule(&stuck);
    ASSERT_EQ(p.seqs.size(), 1u);
    const int32_t first = step_tokens == 64 ? 1 : 3;
    EXPECT_EQ(p.seqs[0].num_tokens, first) << step_tokens;
    EXPECT_EQ(p.seqs[0].logit_rows, first) << step_tokens;
    EXPECT_EQ(p.preempted, 0);
    s->draft = {1, 2, 3, 4};  // 3 + 5 = 8 tokens: fits
    p = f.sched->Schedule(&stuck);
    ASSERT_EQ(p.seqs.size(), 1u);
    const int32_t want = step_tokens == 64 ? 5 : 3;  // cut to the step's budget
    EXPECT_EQ(p.seqs[0].num_tokens, want) << step_tokens;
    EXPECT_EQ(p.seqs[0].logit_rows, want) << step_tokens;
    EXPECT_TRUE(p.seqs[0].want_logits);
  }
}

}  // namespace
}  // namespace agentkv::engine
