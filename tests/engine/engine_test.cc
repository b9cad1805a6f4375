// The engine thread end to end on the CPU backend with a small random model:
// prefix sharing, resident agent caches, preemption, cancellation, drain.
#include "engine/engine.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "deferred_write_backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/finish_reason.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/json_schema.h"
#include "test_model.h"

namespace agentkv::engine {
namespace {

using testing::MapWeights;
using testing::RandomWeights;
using testing::SmallConfig;

// A frequency penalty that changes no logit of these models (|logit| >>
// 1e-30) but sends a row to the host Sampler (ChoosePickMode).
constexpr float kNoOpPenalty = 1e-30f;

struct Done {
  std::vector<int32_t> tokens;
  RequestOutput finished;
};

Done Collect(const RequestHandle& h) {
  Done d;
  while (true) {
    RequestOutput ev = h.stream->Pop();
    if (ev.kind == RequestOutput::Kind::kDelta) {
      d.tokens.insert(d.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      continue;
    }
    d.finished = std::move(ev);
    return d;
  }
}

// The options the engines of these tests start from: 4-token blocks, 8
// sequences of 64-token steps, `blocks` blocks in each cache group of `c`.
EngineOptions SmallOptions(const model::ModelConfig& c, int blocks) {
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = 8;
  o.scheduler.max_step_tokens = 64;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), blocks);
  return o;
}

// An engine with options `o` on the CPU backend over the small model `c`
// (weights of seed 21). With deferred_write_polls > 0, restore copies are
// reported done only after that many polls.
std::unique_ptr<Engine> CpuEngine(const model::ModelConfig& c, const EngineOptions& o,
                                  int deferred_write_polls = 0) {
  auto cpu =
      backend::cpu::CpuBackend::Create(c, RandomWeights(c, 21), backend::cpu::CpuBackendOptions{2});
  EXPECT_TRUE(cpu.ok());
  if (!cpu.ok()) return nullptr;
  std::unique_ptr<backend::Backend> backend = std::move(cpu).value();
  if (deferred_write_polls > 0)
    backend =
        std::make_unique<testing::DeferredWriteBackend>(std::move(backend), deferred_write_polls);
  auto e = Engine::Create(std::move(backend), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return nullptr;
  return std::move(e).value();
}

std::unique_ptr<Engine> MakeEngine(model::Architecture arch, int blocks, bool prefix = true,
                                   int max_batch = 8, bool pipeline = true,
                                   uint64_t host_kv_bytes = 0, int deferred_write_polls = 0) {
  const model::ModelConfig c = SmallConfig(arch);
  EngineOptions o = SmallOptions(c, blocks);
  o.scheduler.max_batch = max_batch;
  o.prefix_caching = prefix;
  o.pipeline = pipeline;
  o.host_kv_memory_bytes = host_kv_bytes;
  return CpuEngine(c, o, deferred_write_polls);
}

EngineRequest Greedy(std::vector<int32_t> prompt, int max_tokens, std::string agent = "") {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  r.agent_key = std::move(agent);
  return r;
}

std::vector<int32_t> Range(int from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((from + 7 * i) % 97);
  return v;
}

TEST(EngineTest, SharedPrefixIsReusedAndGivesSameOutput) {
  auto shared = MakeEngine(model::Architecture::kQwen3, 256, true);
  auto alone = MakeEngine(model::Architecture::kQwen3, 256, false);
  std::vector<int32_t> p = Range(3, 12);  // 3 full blocks of 4
  std::vector<int32_t> a = p, b = p;
  a.insert(a.end(), {5, 6});
  b.insert(b.end(), {8, 9, 10});
  Done first = Collect(shared->Submit(Greedy(a, 6)).value());
  EXPECT_EQ(first.finished.cached_tokens, 0);
  Done second = Collect(shared->Submit(Greedy(b, 6)).value());
  EXPECT_EQ(second.finished.cached_tokens, 12);
  Done ref = Collect(alone->Submit(Greedy(b, 6)).value());
  EXPECT_EQ(ref.finished.cached_tokens, 0);
  EXPECT_EQ(second.tokens, ref.tokens);
  EXPECT_GT(shared->Stats().pools[0].prefix_hits, 0);
}

EngineRequest Salted(std::vector<int32_t> prompt, int max_tokens, std::string salt,
                     std::string agent = "") {
  EngineRequest r = Greedy(std::move(prompt), max_tokens, std::move(agent));
  r.cache_salt = std::move(salt);
  return r;
}

// Tenants (cache salts): the same prompt under another salt, or none, finds
// nothing cached (cached_tokens would tell one tenant another's prompt),
// and computes the same output; the same salt still reuses the prefix.
TEST(EngineTest, CacheSaltsShareNoPrefix) {
  auto e = MakeEngine(model::Architecture::kQwen3, 256, true);
  std::vector<int32_t> p = Range(3, 12);  // 3 full blocks of 4
  p.insert(p.end(), {5, 6});
  Done a = Collect(e->Submit(Salted(p, 6, "4:acme")).value());
  EXPECT_EQ(a.finished.cached_tokens, 0);
  Done z = Collect(e->Submit(Salted(p, 6, "4:zeta")).value());
  EXPECT_EQ(z.finished.cached_tokens, 0);
  EXPECT_EQ(z.finished.cache_source, CacheSource::kNone);
  EXPECT_EQ(z.tokens, a.tokens);
  Done plain = Collect(e->Submit(Greedy(p, 6)).value());
  EXPECT_EQ(plain.finished.cached_tokens, 0);
  EXPECT_EQ(plain.tokens, a.tokens);
  Done a2 = Collect(e->Submit(Salted(p, 6, "4:acme")).value());
  EXPECT_EQ(a2.finished.cached_tokens, 12);
  EXPECT_EQ(a2.tokens, a.tokens);
  Done plain2 = Collect(e->Submit(Greedy(p, 6)).value());
  EXPECT_EQ(plain2.finished.cached_tokens, 12);
}

// A sequence that stops on a sampled stop token leaves the step launched
// after it (pipelining) in flight; the engine still goes idle, so a drain
// returns at once instead of waiting out its deadline.
TEST(EngineTest, DrainReturnsAfterAStopTokenEndsAPipelinedSequence) {
  auto e = MakeEngine(model::Architecture::kQwen3, 256, true, 8, /*pipeline=*/true);
  const std::vector<int32_t> prompt = Range(4, 9);
  Done free_run = Collect(e->Submit(Greedy(prompt, 8)).value());
  ASSERT_EQ(free_run.tokens.size(), 8u);
  EngineRequest stopped = Greedy(prompt, 8);
  stopped.params.stop_token_ids = {free_run.tokens[3]};
  Done d = Collect(e->Submit(stopped).value());
  EXPECT_EQ(d.finished.finish, FinishReason::kStop);
  EXPECT_LE(d.tokens.size(), 4u);
  EXPECT_TRUE(e->Drain(5.0)) << "the engine never went idle";
}

TEST(EngineTest, AgentResidentCacheCarriesToTheNextTurn) {
  auto e = MakeEngine(model::Architecture::kLlama, 256);
  std::vector<int32_t> turn1 = Range(1, 10);
  Done d1 = Collect(e->Submit(Greedy(turn1, 9, "agent-1")).value());
  ASSERT_EQ(d1.tokens.size(), 9u);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), d1.tokens.begin(), d1.tokens.end());
  turn2.insert(turn2.end(), {11, 12, 13});
  // 10 + 9 = 19 tokens: the last generated token's KV was never computed, so
  // 18 are cached, in 4 full blocks = 16 tokens.
  Done d2 = Collect(e->Submit(Greedy(turn2, 3, "agent-1")).value());
  EXPECT_EQ(d2.finished.cached_tokens, 16);
  EXPECT_EQ(e->Stats().resident_agents, 1);
}

TEST(EngineTest, PreemptionGivesIdenticalGreedyOutput) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(Range(10 + i, 5 + 3 * i));
  auto run = [&](int blocks, int64_t* preemptions) {
    auto e = MakeEngine(model::Architecture::kQwen3, blocks, /*prefix=*/false, 6);
    std::vector<RequestHandle> hs;
    for (auto& p : prompts) hs.push_back(e->Submit(Greedy(p, 24)).value());
    std::vector<std::vector<int32_t>> outs;
    for (auto& h : hs) {
      Done d = Collect(h);
      EXPECT_EQ(d.finished.kind, RequestOutput::Kind::kFinished);
      outs.push_back(d.tokens);
    }
    *preemptions = e->Stats().preemptions;
    // Nothing is left referenced: what finished early was settled and freed.
    EXPECT_EQ(e->Stats().pools[0].in_use, 0);
    return outs;
  };
  int64_t big_pre = 0, small_pre = 0;
  const auto big = run(512, &big_pre);
  const auto small = run(18, &small_pre);  // 72 tokens for 6 sequences of up to 44
  EXPECT_EQ(big_pre, 0);
  EXPECT_GT(small_pre, 0);
  EXPECT_EQ(small, big);
}

// Pipelined steps (the default) give what collecting every step before
// planning the next gives: greedy and sampled requests, a stop token met
// while the next step is already launched, length limits, preemption
// (a small pool), prefix hits and an agent's second turn.
TEST(EngineTest, PipelinedStepsChangeNoOutput) {
  const std::vector<int32_t> probe = Range(40, 9);
  int32_t stop_id = -1;
  size_t stop_at = 0;
  {
    auto e = MakeEngine(model::Architecture::kQwen3, 256, true, 8, /*pipeline=*/false);
    Done d = Collect(e->Submit(Greedy(probe, 12)).value());
    ASSERT_EQ(d.tokens.size(), 12u);
    stop_id = d.tokens[4];
    stop_at = std::find(d.tokens.begin(), d.tokens.end(), stop_id) - d.tokens.begin();
  }
  struct Out {
    std::vector<int32_t> tokens;
    FinishReason finish;
    int64_t completion, cached;
    bool operator==(const Out&) const = default;
  };
  auto run = [&](bool pipeline, int64_t* preemptions) {
    // (Timing decides which blocks are still cached when a request comes.)
    auto e = MakeEngine(model::Architecture::kQwen3, 20, true, 6, pipeline);
    std::vector<EngineRequest> reqs;
    for (int i = 0; i < 6; ++i) reqs.push_back(Greedy(Range(10 + i, 5 + 3 * i), 3 + 4 * i));
    std::vector<int32_t> shared = Range(3, 12);
    shared.push_back(1);
    reqs.push_back(Greedy(shared, 7));
    EngineRequest sampled = Greedy(Range(60, 7), 15);
    sampled.params.temperature = 0.8f;
    sampled.params.seed = 7;
    reqs.push_back(sampled);
    EngineRequest stopped = Greedy(probe, 12);
    stopped.params.stop_token_ids = {stop_id};
    reqs.push_back(stopped);
    std::vector<RequestHandle> hs;
    for (auto& r : reqs) hs.push_back(e->Submit(r).value());
    std::vector<Out> outs;
    for (auto& h : hs) {
      Done d = Collect(h);
      outs.push_back(
          {d.tokens, d.finished.finish, d.finished.completion_tokens, d.finished.cached_tokens});
    }
    // An agent's two turns, then a prompt sharing the first's prefix.
    std::vector<int32_t> turn = Range(5, 10);
    Done t1 = Collect(e->Submit(Greedy(turn, 9, "agent")).value());
    turn.insert(turn.end(), t1.tokens.begin(), t1.tokens.end());
    turn.push_back(2);
    Done t2 = Collect(e->Submit(Greedy(turn, 5, "agent")).value());
    shared.back() = 4;
    Done p = Collect(e->Submit(Greedy(shared, 4)).value());
    for (const Done* d : {&t1, &t2, &p})
      outs.push_back({d->tokens, d->finished.finish, d->finished.completion_tokens,
                      d->finished.cached_tokens});
    *preemptions = e->Stats().preemptions;
    // Nothing is left referenced: what finished early was settled and freed.
    EXPECT_EQ(e->Stats().pools[0].in_use, 0);
    return outs;
  };
  int64_t pre_on = 0, pre_off = 0;
  const std::vector<Out> on = run(true, &pre_on), off = run(false, &pre_off);
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    EXPECT_EQ(on[i].tokens, off[i].tokens) << i;
    EXPECT_EQ(on[i].finish, off[i].finish) << i;
    EXPECT_EQ(on[i].completion, off[i].completion) << i;
    EXPECT_EQ(on[i].completion, static_cast<int64_t>(on[i].tokens.size())) << i;
  }
  // The stop token ends its request where it first comes (excluded).
  EXPECT_EQ(on[8].tokens.size(), stop_at);
  EXPECT_EQ(on[8].finish, FinishReason::kStop);
  // The agent's second turn finds its first turn pinned in both.
  EXPECT_EQ(on[on.size() - 2].cached, off[off.size() - 2].cached);
  EXPECT_GT(on[on.size() - 2].cached, 0);
  // (The pipelined run reserves each next position one step earlier, so it
  // meets the pool's limit sooner.)
  EXPECT_GT(pre_on, 0);
}

TEST(EngineTest, CancelledRequestReleasesItsBlocks) {
  auto e = MakeEngine(model::Architecture::kQwen3, 128, /*prefix=*/false);
  RequestHandle h = e->Submit(Greedy(Range(2, 30), 400)).value();
  RequestOutput ev = h.stream->Pop();  // first token: it is running
  ASSERT_EQ(ev.kind, RequestOutput::Kind::kDelta);
  // Stats are published before a step's tokens are pushed: no waiting.
  EXPECT_EQ(e->Stats().running, 1);
  EXPECT_GT(e->Stats().pools[0].in_use, 0);
  e->Cancel(h.id);
  while (ev.kind == RequestOutput::Kind::kDelta) ev = h.stream->Pop();
  EXPECT_TRUE(ev.cancelled);
  EXPECT_LT(ev.completion_tokens, 400);
  e->Drain();
  const cache::BlockPoolStats st = e->Stats().pools[0];
  EXPECT_EQ(st.in_use, 0);
  EXPECT_EQ(st.free, 128);
}

TEST(EngineTest, StepTokensDefaultToTheBackends) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const MapWeights w = RandomWeights(c, 21);
  auto backend = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{1});
  ASSERT_TRUE(backend.ok());
  const int want = (*backend)->default_step_tokens();
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_step_tokens = 0;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), 64);
  auto e = Engine::Create(std::move(backend).value(), nullptr, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->max_step_tokens(), want);
  Done d = Collect((*e)->Submit(Greedy(Range(2, 20), 4)).value());
  EXPECT_EQ(d.tokens.size(), 4u);
  auto e2 = MakeEngine(model::Architecture::kQwen3, 64);  // an explicit budget is kept
  EXPECT_EQ(e2->max_step_tokens(), 64);
}

TEST(EngineTest, StatsAreCurrentWhenAnEventArrives) {
  auto e = MakeEngine(model::Architecture::kQwen3, 128);
  RequestHandle h = e->Submit(Greedy(Range(2, 30), 5, "agent-a")).value();
  RequestOutput ev = h.stream->Pop();
  while (ev.kind == RequestOutput::Kind::kDelta) ev = h.stream->Pop();
  ASSERT_EQ(ev.kind, RequestOutput::Kind::kFinished);
  // Seen the end: no longer running, blocks released, the agent's KV
  // resident. (While it runs, stats may already be past the event a client
  // has popped; CancelledRequestReleasesItsBlocks checks a running one.)
  EXPECT_EQ(e->Stats().running, 0);
  EXPECT_EQ(e->Stats().pools[0].in_use, 0);
  EXPECT_EQ(e->Stats().resident_agents, 1);
  EXPECT_GT(e->AgentResidentTokens("agent-a"), 0);
}

TEST(EngineTest, SlidingWindowModelRunsWithoutPrefixCache) {
  auto e = MakeEngine(model::Architecture::kGemma3, 64);
  Done d = Collect(e->Submit(Greedy(Range(4, 30), 10, "g")).value());
  EXPECT_EQ(d.tokens.size(), 10u);
  EXPECT_EQ(d.finished.finish, FinishReason::kLength);
}

TEST(EngineTest, RejectsBadRequestsAndDrains) {
  auto e = MakeEngine(model::Architecture::kQwen3, 64);
  EXPECT_EQ(e->Submit(Greedy({}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Greedy({1000}, 4)).status().code(), StatusCode::kInvalidArgument);
  EngineRequest bad = Greedy({1, 2}, 4);
  bad.params.temperature = -1;
  EXPECT_EQ(e->Submit(bad).status().code(), StatusCode::kInvalidArgument);
  // A prompt that can never fit the pool (64 blocks x 4 = 256 tokens) is
  // refused up front, before anything streams.
  Result<RequestHandle> huge = e->Submit(Greedy(Range(0, 300), 4));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("at most 256 tokens"), std::string::npos);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(e->Submit(Greedy(Range(i, 6), 5)).value());
  e->Drain();
  for (auto& h : hs) EXPECT_TRUE(h.stream->closed());
  EXPECT_EQ(e->Submit(Greedy({1, 2}, 4)).status().code(), StatusCode::kCancelled);
}

// An engine that cannot be built fails cleanly (nothing half-started is
// left to stop).
TEST(EngineTest, CreateFailsCleanlyOnABadLayout) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  auto backend =
      backend::cpu::CpuBackend::Create(c, RandomWeights(c, 21), backend::cpu::CpuBackendOptions{1});
  ASSERT_TRUE(backend.ok());
  EngineOptions o;
  o.block_size = 4;
  o.host_kv_memory_bytes = 1 << 20;
  o.blocks_per_group = {16, 16};  // the model has one cache group
  auto e = Engine::Create(std::move(backend).value(), nullptr, o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

// The logits rows the backend copies into (host-picked rows, kept rows
// read back) come from its host buffers (pinned on a GPU, so the copies
// run asynchronously): one row per sequence of the batch. An engine that
// cannot have them is not created.
TEST(EngineTest, LogitsRowsComeFromTheBackendsHostBuffers) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const size_t logits_bytes = 8 * static_cast<size_t>(c.vocab_size) * sizeof(float);
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = 8;
  o.scheduler.max_step_tokens = 64;
  o.blocks_per_group = {64};
  for (bool fail : {false, true}) {
    auto cpu = backend::cpu::CpuBackend::Create(c, RandomWeights(c, 21),
                                                backend::cpu::CpuBackendOptions{1});
    ASSERT_TRUE(cpu.ok());
    auto wrapped = std::make_unique<testing::DeferredWriteBackend>(std::move(cpu).value(), 1);
    testing::DeferredWriteBackend* w = wrapped.get();
    if (fail) w->FailHostBuffersOf(logits_bytes);
    auto e = Engine::Create(std::move(wrapped), nullptr, o);
    if (fail) {
      ASSERT_FALSE(e.ok());
      EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const std::vector<size_t>& asked = w->host_buffer_requests();
    EXPECT_NE(std::find(asked.begin(), asked.end(), logits_bytes), asked.end());
    // Host rows (a penalty) run through them.
    EngineRequest r = Greedy(Range(2, 7), 6);
    r.params.frequency_penalty = kNoOpPenalty;
    EXPECT_EQ(Collect((*e)->Submit(std::move(r)).value()).tokens.size(), 6u);
  }
}

// Host-memory tier: an agent whose pool blocks were evicted gets them back
// from host memory (source "host"), and its reply is what a full recompute
// gives.
TEST(EngineHostTierTest, EvictedAgentResumesFromHostWithRecomputedOutput) {
  auto e = MakeEngine(model::Architecture::kQwen3, 24, true, 8, true, /*host_kv_bytes=*/1 << 20);
  auto ref = MakeEngine(model::Architecture::kQwen3, 256, /*prefix=*/false);
  std::vector<int32_t> turn1 = Range(1, 30);
  Done d1 = Collect(e->Submit(Greedy(turn1, 6, "agent-h")).value());
  ASSERT_EQ(d1.tokens.size(), 6u);
  // Others' long prompts push the agent's pinned blocks out of the pool.
  for (int i = 0; i < 2; ++i) Collect(e->Submit(Greedy(Range(40 + i, 80), 2)).value());
  EXPECT_GT(e->Stats().host_kv_blocks, 0);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), d1.tokens.begin(), d1.tokens.end());
  turn2.insert(turn2.end(), {11, 12, 13});
  Done d2 = Collect(e->Submit(Greedy(turn2, 8, "agent-h")).value());
  // 30 + 6 tokens, the last never computed: 8 full blocks = 32 tokens.
  EXPECT_EQ(d2.finished.cached_tokens, 32);
  EXPECT_EQ(d2.finished.cache_source, CacheSource::kHost);
  EXPECT_GT(d2.finished.restored_tokens, 0);
  Done r = Collect(ref->Submit(Greedy(turn2, 8)).value());
  EXPECT_EQ(r.finished.cached_tokens, 0);
  EXPECT_EQ(d2.tokens, r.tokens);
  const EngineStats st = e->Stats();
  EXPECT_EQ(st.resumed_host, 1);
  EXPECT_GT(st.host_restored_tokens, 0);
  EXPECT_GT(st.host_kv_hits, 0);
  EXPECT_LE(st.host_kv_bytes, st.host_kv_capacity_bytes);
}

// The same with restore copies that finish late (as a GPU's asynchronous
// ones): the engine never waits for them, the steps after them see the
// restored KV, and the host-tier slots they read stay untouched until done.
TEST(EngineHostTierTest, EvictedAgentResumesFromHostThroughAsynchronousCopies) {
  auto e = MakeEngine(model::Architecture::kQwen3, 24, true, 8, true, /*host_kv_bytes=*/1 << 20,
                      /*deferred_write_polls=*/4);
  auto ref = MakeEngine(model::Architecture::kQwen3, 256, /*prefix=*/false);
  std::vector<int32_t> turn1 = Range(1, 30);
  Done d1 = Collect(e->Submit(Greedy(turn1, 6, "agent-h")).value());
  for (int i = 0; i < 2; ++i) Collect(e->Submit(Greedy(Range(40 + i, 80), 2)).value());
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), d1.tokens.begin(), d1.tokens.end());
  turn2.insert(turn2.end(), {11, 12, 13});
  Done d2 = Collect(e->Submit(Greedy(turn2, 8, "agent-h")).value());
  EXPECT_EQ(d2.finished.cached_tokens, 32);
  EXPECT_EQ(d2.finished.cache_source, CacheSource::kHost);
  Done r = Collect(ref->Submit(Greedy(turn2, 8)).value());
  EXPECT_EQ(d2.tokens, r.tokens);
  // Others keep running while the copies of a restore are in flight.
  for (int i = 0; i < 3; ++i) Collect(e->Submit(Greedy(Range(60 + i, 40), 3)).value());
  ASSERT_TRUE(e->Drain(-1));
  const EngineStats st = e->Stats();
  EXPECT_GT(st.host_restored_tokens, 0);
  EXPECT_GT(st.host_write_done_seconds, 0);
  std::unique_ptr<backend::Backend> b = e->ReleaseBackend();
  auto* dev = dynamic_cast<testing::DeferredWriteBackend*>(b.get());
  ASSERT_NE(dev, nullptr);
  EXPECT_GT(dev->writes_started(), 0);
  EXPECT_EQ(dev->writes_pending(), 0u);
  EXPECT_EQ(dev->source_changes(), 0);
}

// Without the host tier the same agent recomputes what the pool lost.
TEST(EngineHostTierTest, WithoutHostTierEvictedBlocksAreRecomputed) {
  auto e = MakeEngine(model::Architecture::kQwen3, 24, true, 8, true, /*host_kv_bytes=*/0);
  std::vector<int32_t> turn1 = Range(1, 30);
  Done d1 = Collect(e->Submit(Greedy(turn1, 6, "agent-h")).value());
  for (int i = 0; i < 2; ++i) Collect(e->Submit(Greedy(Range(40 + i, 80), 2)).value());
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), d1.tokens.begin(), d1.tokens.end());
  turn2.insert(turn2.end(), {11, 12, 13});
  Done d2 = Collect(e->Submit(Greedy(turn2, 8, "agent-h")).value());
  EXPECT_LT(d2.finished.cached_tokens, 32);
  EXPECT_NE(d2.finished.cache_source, CacheSource::kHost);
  EXPECT_EQ(e->Stats().host_kv_capacity_bytes, 0);
  EXPECT_EQ(e->Stats().resumed_host, 0);
}

// Preemption swaps to host memory: a preempted sequence's evicted blocks
// come back from the host tier, and every output is what an unpreempted run
// gives.
TEST(EngineHostTierTest, PreemptedSequencesResumeFromHostWithIdenticalOutput) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(Range(10 + i, 9 + 3 * i));
  auto run = [&](int blocks, uint64_t host, EngineStats* stats) {
    auto e = MakeEngine(model::Architecture::kQwen3, blocks, /*prefix=*/true, 6, true, host);
    std::vector<RequestHandle> hs;
    for (auto& p : prompts) hs.push_back(e->Submit(Greedy(p, 24)).value());
    std::vector<std::vector<int32_t>> outs;
    for (auto& h : hs) {
      Done d = Collect(h);
      EXPECT_EQ(d.finished.kind, RequestOutput::Kind::kFinished);
      outs.push_back(d.tokens);
    }
    *stats = e->Stats();
    EXPECT_EQ(stats->pools[0].in_use, 0);
    return outs;
  };
  EngineStats big, small;
  const auto want = run(512, 0, &big);
  const auto got = run(22, 1 << 20, &small);
  EXPECT_EQ(big.preemptions, 0);
  EXPECT_GT(small.preemptions, 0);
  EXPECT_GT(small.host_restored_tokens, 0)
      << "preemptions " << small.preemptions << " host inserts " << small.host_kv_inserts
      << " hits " << small.host_kv_hits << " evictions " << small.pools[0].evictions;
  EXPECT_EQ(got, want);
}

// The tier belongs to its engine: an engine built next on the same backend
// (as a model swap does) starts with an empty one and never serves the old
// engine's blocks.
TEST(EngineHostTierTest, ANewEngineNeverSeesTheOldEnginesHostBlocks) {
  auto e = MakeEngine(model::Architecture::kQwen3, 24, true, 8, true, 1 << 20);
  std::vector<int32_t> turn1 = Range(1, 30);
  Collect(e->Submit(Greedy(turn1, 6, "agent-h")).value());
  for (int i = 0; i < 2; ++i) Collect(e->Submit(Greedy(Range(40 + i, 80), 2)).value());
  ASSERT_GT(e->Stats().host_kv_blocks, 0);
  std::unique_ptr<backend::Backend> backend = e->ReleaseBackend();
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = 8;
  o.scheduler.max_step_tokens = 64;
  o.host_kv_memory_bytes = 1 << 20;
  o.blocks_per_group.assign(1, 24);
  auto e2 = Engine::Create(std::move(backend), nullptr, o);
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();
  EXPECT_EQ((*e2)->Stats().host_kv_blocks, 0);
  Done d = Collect((*e2)->Submit(Greedy(turn1, 2, "agent-h")).value());
  EXPECT_EQ(d.finished.cached_tokens, 0);
  EXPECT_EQ(d.finished.cache_source, CacheSource::kNone);
  EXPECT_EQ((*e2)->Stats().host_kv_hits, 0);
}

// The host tier is keyed by the salted chain too: an agent's blocks that
// the pool evicted come back for its own tenant only.
TEST(EngineHostTierTest, HostTierServesOnlyTheSameSalt) {
  auto e = MakeEngine(model::Architecture::kQwen3, 24, true, 8, true, /*host_kv_bytes=*/1 << 20);
  std::vector<int32_t> turn1 = Range(1, 30);
  Done d1 = Collect(e->Submit(Salted(turn1, 6, "4:acme", "acme/a")).value());
  for (int i = 0; i < 2; ++i) Collect(e->Submit(Greedy(Range(40 + i, 80), 2)).value());
  ASSERT_GT(e->Stats().host_kv_blocks, 0);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), d1.tokens.begin(), d1.tokens.end());
  turn2.insert(turn2.end(), {11, 12, 13});
  const int64_t hits = e->Stats().host_kv_hits;
  Done other = Collect(e->Submit(Salted(turn2, 8, "4:zeta", "zeta/a")).value());
  EXPECT_EQ(other.finished.cached_tokens, 0);
  EXPECT_EQ(other.finished.cache_source, CacheSource::kNone);
  EXPECT_EQ(e->Stats().host_kv_hits, hits);
  Done own = Collect(e->Submit(Salted(turn2, 8, "4:acme", "acme/a")).value());
  EXPECT_GT(own.finished.cached_tokens, 0);
  EXPECT_EQ(own.tokens, other.tokens);
}

// Sampled rows of a step are drawn on several threads: each sequence has
// its own sampler and seed, so the outputs are those of drawing them one by
// one on the engine thread, and a mixed greedy / sampled batch keeps its
// greedy rows as they were.
TEST(EngineTest, ParallelSamplingGivesTheSerialDraws) {
  auto run = [](int threads) {
    const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
    auto backend = backend::cpu::CpuBackend::Create(c, RandomWeights(c, 21),
                                                    backend::cpu::CpuBackendOptions{1});
    EXPECT_TRUE(backend.ok());
    EngineOptions o;
    o.block_size = 4;
    o.scheduler.max_batch = 8;
    o.scheduler.max_step_tokens = 64;
    o.sample_threads = threads;
    o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), 256);
    auto e = Engine::Create(std::move(backend).value(), nullptr, o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    std::vector<RequestHandle> hs;
    for (int i = 0; i < 8; ++i) {
      EngineRequest r = Greedy(Range(3 + i, 6 + i), 12);
      if (i % 4 != 0) {  // rows 1-3, 5-7 sampled, 0 and 4 greedy
        r.params.temperature = 1.0f;
        r.params.top_p = i % 2 ? 0.9f : 1.0f;
        r.params.seed = 100 + i;
        // A penalty too small to change any logit keeps a row on the host
        // sampler (the threads); row 7 is drawn by the backend.
        if (i != 7) r.params.frequency_penalty = kNoOpPenalty;
      }
      hs.push_back((*e)->Submit(std::move(r)).value());
    }
    std::vector<std::vector<int32_t>> outs;
    for (auto& h : hs) outs.push_back(Collect(h).tokens);
    return outs;
  };
  const auto serial = run(1);
  EXPECT_EQ(run(4), serial);
  EXPECT_EQ(run(0), serial);  // the machine's default
  for (const auto& out : serial) EXPECT_EQ(out.size(), 12u);
}

// A seeded sampled request gives the same tokens whether the backend draws
// it (plain params: PickMode::kDevice) or its Sampler draws it from the
// logits (a penalty asked: kHost, the way every sampled row went before the
// backends drew): the backend's draw takes its uniform from the sequence's
// Sampler at launch. Both kinds in one batch; pipelined or not; run after
// run.
TEST(EngineTest, BackendDrawnRowsGiveTheSamplersTokens) {
  auto run = [](bool pipeline, bool with_host_rows) {
    auto e = MakeEngine(model::Architecture::kLlama, 256, true, 8, pipeline);
    std::vector<RequestHandle> hs;
    for (int i = 0; i < 8; ++i) {
      if (i % 2 && !with_host_rows) continue;
      const int pair = i / 2;
      EngineRequest r = Greedy(Range(3 + pair, 6 + pair), 16);
      r.params.temperature = 1.0f;  // the OpenAI and Anthropic default, nothing else set
      if (pair == 1) r.params.top_p = 0.9f;
      if (pair == 2) {
        r.params.top_k = 20;
        r.params.min_p = 0.05f;
      }
      if (pair == 3) {
        r.params.temperature = 0.7f;
        r.params.top_k = 40;
        r.params.top_p = 0.8f;
      }
      r.params.seed = 500 + pair;
      if (i % 2) r.params.frequency_penalty = kNoOpPenalty;  // the host sampler's row
      hs.push_back(e->Submit(std::move(r)).value());
    }
    std::vector<std::vector<int32_t>> outs;
    for (auto& h : hs) outs.push_back(Collect(h).tokens);
    return outs;
  };
  const auto mixed = run(true, true);
  ASSERT_EQ(mixed.size(), 8u);
  for (int pair = 0; pair < 4; ++pair) {
    EXPECT_EQ(mixed[2 * pair].size(), 16u);
    EXPECT_EQ(mixed[2 * pair], mixed[2 * pair + 1]) << "pair " << pair;
  }
  EXPECT_EQ(run(true, true), mixed);  // reproducible
  EXPECT_EQ(run(false, true), mixed);
  // Backend-drawn rows alone pipeline; the same tokens.
  const auto drawn = run(true, false);
  ASSERT_EQ(drawn.size(), 4u);
  for (int pair = 0; pair < 4; ++pair) EXPECT_EQ(drawn[pair], mixed[2 * pair]) << "pair " << pair;
  // And they are draws, not the greedy tokens.
  auto e = MakeEngine(model::Architecture::kLlama, 256, true, 8, true);
  int differ = 0;
  for (int pair = 0; pair < 4; ++pair)
    differ +=
        Collect(e->Submit(Greedy(Range(3 + pair, 6 + pair), 16)).value()).tokens != mixed[2 * pair];
  EXPECT_GT(differ, 0);
}

// Every output token of a request asking for logprobs comes with its own
// entry (greedy: the token is the most likely one), and asking changes no
// token; a request without them gets none.
TEST(EngineTest, LogprobsComeWithEachOutputToken) {
  auto e = MakeEngine(model::Architecture::kQwen3, 256, true, 8, /*pipeline=*/true);
  const std::vector<int32_t> prompt = Range(4, 9);
  Done plain = Collect(e->Submit(Greedy(prompt, 8)).value());
  EngineRequest r = Greedy(prompt, 8);
  r.params.logprobs = 3;
  RequestHandle h = e->Submit(r).value();
  std::vector<int32_t> tokens;
  std::vector<OutputLogprobs> lps;
  for (RequestOutput ev = h.stream->Pop(); ev.kind == RequestOutput::Kind::kDelta;
       ev = h.stream->Pop()) {
    EXPECT_EQ(ev.logprobs.size(), ev.tokens.size());
    tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
    lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
  }
  EXPECT_EQ(tokens, plain.tokens);
  ASSERT_EQ(lps.size(), tokens.size());
  for (size_t i = 0; i < lps.size(); ++i) {
    ASSERT_EQ(lps[i].top.size(), 3u);
    EXPECT_EQ(lps[i].top[0].token, tokens[i]);
    EXPECT_FLOAT_EQ(lps[i].top[0].logprob, lps[i].logprob);
    EXPECT_LE(lps[i].logprob, 0.0f);
    EXPECT_GE(lps[i].top[0].logprob, lps[i].top[1].logprob);
    EXPECT_GE(lps[i].top[1].logprob, lps[i].top[2].logprob);
  }
  RequestHandle none = e->Submit(Greedy(prompt, 4)).value();
  for (RequestOutput ev = none.stream->Pop(); ev.kind == RequestOutput::Kind::kDelta;
       ev = none.stream->Pop()) {
    EXPECT_TRUE(ev.logprobs.empty());
  }
}

// Rows with logprobs and no penalties are picked by a backend that computes
// logprobs next to its picks (the CPU backend's default path), else by the
// host Sampler (a wrapped backend says it does not): the same tokens and
// the same values, greedy and seeded draws alike.
TEST(EngineTest, BackendLogprobsMatchTheSamplers) {
  auto on_backend = MakeEngine(model::Architecture::kQwen3, 256, true, 8, true);
  auto on_host =
      MakeEngine(model::Architecture::kQwen3, 256, true, 8, true, 0, /*deferred_write_polls=*/1);
  for (float t : {0.0f, 0.7f}) {
    EngineRequest r = Greedy(Range(4, 11), 6);
    r.params.temperature = t;
    r.params.seed = 12;
    r.params.logprobs = 4;
    auto run = [&](Engine& e) {
      std::pair<std::vector<int32_t>, std::vector<OutputLogprobs>> got;
      RequestHandle h = e.Submit(r).value();
      for (RequestOutput ev = h.stream->Pop(); ev.kind == RequestOutput::Kind::kDelta;
           ev = h.stream->Pop()) {
        got.first.insert(got.first.end(), ev.tokens.begin(), ev.tokens.end());
        got.second.insert(got.second.end(), ev.logprobs.begin(), ev.logprobs.end());
      }
      return got;
    };
    const auto a = run(*on_backend);
    const auto b = run(*on_host);
    ASSERT_EQ(a.first, b.first) << "temperature " << t;
    ASSERT_EQ(a.second.size(), a.first.size());
    ASSERT_EQ(b.second.size(), b.first.size());
    for (size_t i = 0; i < a.second.size(); ++i) {
      EXPECT_NEAR(a.second[i].logprob, b.second[i].logprob, 1e-5);
      ASSERT_EQ(a.second[i].top.size(), 4u);
      ASSERT_EQ(b.second[i].top.size(), 4u);
      for (size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(a.second[i].top[k].token, b.second[i].top[k].token);
        EXPECT_NEAR(a.second[i].top[k].logprob, b.second[i].top[k].logprob, 1e-5);
      }
    }
  }
}

// Requests asking for logprobs pipeline as those without (the backend
// computes the logprobs next to its picks, and they come with the step's
// picks when it is collected): every decode step after the first is
// launched while the one before is in flight, greedy and seeded draws
// alike, and the tokens are those of the same requests without logprobs.
// Rows the host Sampler picks (a penalty) are collected step by step.
TEST(EngineTest, LogprobStepsPipelineAsPlainOnes) {
  constexpr int kTokens = 12;
  auto run = [](std::optional<int32_t> logprobs, float temperature, bool penalty,
                int64_t* pipelined) {
    auto e = MakeEngine(model::Architecture::kQwen3, 256, true, 8, /*pipeline=*/true);
    std::vector<RequestHandle> hs;
    for (int i = 0; i < 4; ++i) {
      EngineRequest r = Greedy(Range(3 + i, 6 + i), kTokens);
      r.params.temperature = temperature;
      r.params.seed = 40 + i;
      r.params.logprobs = logprobs;
      if (penalty) r.params.frequency_penalty = kNoOpPenalty;
      hs.push_back(e->Submit(std::move(r)).value());
    }
    std::vector<std::vector<int32_t>> outs;
    for (auto& h : hs) {
      std::vector<int32_t> toks;
      size_t lps = 0;
      for (RequestOutput ev = h.stream->Pop(); ev.kind == RequestOutput::Kind::kDelta;
           ev = h.stream->Pop()) {
        toks.insert(toks.end(), ev.tokens.begin(), ev.tokens.end());
        lps += ev.logprobs.size();
      }
      EXPECT_EQ(lps, logprobs ? toks.size() : 0u);
      outs.push_back(std::move(toks));
    }
    *pipelined = e->Stats().pipelined_steps;
    return outs;
  };
  for (float t : {0.0f, 0.8f}) {
    int64_t plain_pipelined = 0, lp_pipelined = 0, host_pipelined = 0;
    const auto plain = run(std::nullopt, t, false, &plain_pipelined);
    const auto with_lp = run(5, t, false, &lp_pipelined);
    const auto on_host = run(5, t, true, &host_pipelined);
    EXPECT_EQ(with_lp, plain) << "temperature " << t;
    EXPECT_EQ(on_host, plain) << "temperature " << t;
    for (const auto& out : plain) EXPECT_EQ(out.size(), static_cast<size_t>(kTokens));
    // At least the decode steps after the last request's first token.
    EXPECT_GE(plain_pipelined, kTokens - 2) << "temperature " << t;
    EXPECT_GE(lp_pipelined, kTokens - 2) << "temperature " << t;
    EXPECT_EQ(host_pipelined, 0) << "temperature " << t;
  }
}

// The small model's 97 ids as JSON pieces (ids past the list: letters; 96
// none, the stop token), for a json_object grammar over its vocabulary.
std::shared_ptr<const grammar::Grammar> SmallJsonObjectGrammar() {
  std::vector<std::string> tokens = {"{",  "}",   "\"",    ":",    ",",   " ",   "[", "]",
                                     "1",  "2",   "true",  "null", "\"a", "b\"", "-", ".",
                                     "\\", "\\n", "false", "e",    "{\"", "\":", "0"};
  for (int i = static_cast<int>(tokens.size()); i < 96; ++i)
    tokens.push_back(std::string(1, static_cast<char>('a' + i % 26)) + (i % 3 ? "x" : ""));
  tokens.push_back("");  // 96: the requests' stop token (no bytes)
  auto g = grammar::CompileAnyJsonObject(grammar::TokenVocabulary::FromTokens(tokens));
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

// Constrained rows picked optimistically (the backend's pick checked
// against the grammar; the kept row masked and picked again only when
// rejected) give greedy requests the tokens of masking every row first, in
// a batch with unconstrained and top_p rows; seeded draws repeat, and are
// the same when the host makes the optimistic picks (kAuto on the CPU);
// every output follows the grammar; the random model makes the grammar
// reject some picks, so both paths run.
TEST(EngineTest, OptimisticGrammarPicksGiveTheMaskedPicks) {
  const auto g = SmallJsonObjectGrammar();
  auto run = [&](OptimisticGrammar mode, bool pipeline, EngineStats* stats) {
    const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
    EngineOptions o = SmallOptions(c, 256);
    o.pipeline = pipeline;
    o.optimistic_grammar = mode;
    auto e = CpuEngine(c, o);
    std::vector<RequestHandle> hs;
    for (int i = 0; i < 8; ++i) {
      EngineRequest r = Greedy(Range(3 + i, 6 + i), 24);
      if (i != 7) {  // row 7: unconstrained
        r.params.grammar = g;
        r.params.ignore_eos = false;
        r.params.stop_token_ids = {96};
      }
      if (i >= 4) {
        r.params.temperature = 1.0f;
        r.params.seed = 40 + i;
      }
      if (i == 6) r.params.top_p = 0.9f;  // the exact path either way
      hs.push_back(e->Submit(std::move(r)).value());
    }
    std::vector<std::vector<int32_t>> outs;
    for (auto& h : hs) outs.push_back(Collect(h).tokens);
    *stats = e->Stats();
    return outs;
  };
  EngineStats masked_stats, opt_stats, again_stats;
  const auto masked = run(OptimisticGrammar::kOff, true, &masked_stats);
  const auto opt = run(OptimisticGrammar::kOn, true, &opt_stats);
  EXPECT_EQ(masked_stats.grammar_optimistic_rows, 0);
  EXPECT_GT(opt_stats.grammar_optimistic_rows, 0);
  EXPECT_GT(opt_stats.grammar_rejected_rows, 0);
  EXPECT_LT(opt_stats.grammar_rejected_rows, opt_stats.grammar_optimistic_rows);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(opt[i], masked[i]) << "greedy request " << i;
  EXPECT_EQ(opt[6], masked[6]) << "top_p: masked first either way";
  EXPECT_EQ(opt[7], masked[7]) << "unconstrained";
  EXPECT_EQ(run(OptimisticGrammar::kOn, true, &again_stats), opt) << "seeded draws repeat";
  EXPECT_EQ(run(OptimisticGrammar::kOn, false, &again_stats), opt) << "pipelining changes nothing";
  // The CPU backend's default: its rows picked on the host, by the same
  // procedure: the same tokens, seeded draws included.
  EXPECT_EQ(run(OptimisticGrammar::kAuto, true, &again_stats), opt) << "host optimistic picks";
  EXPECT_EQ(again_stats.grammar_optimistic_rows, 0);
  for (int i = 0; i < 7; ++i) {
    grammar::GrammarMatcher m(g);
    for (int32_t t : opt[i]) EXPECT_TRUE(m.Advance(t).ok()) << "request " << i;
  }
}

// Pipelined steps with optimistically picked constrained rows: the next
// step launches on the backend's picks before the grammar checks them; a
// rejected pick rolls its sequence back (its row of the step in flight
// discarded). A batch of constrained (greedy and seeded temperature 1) and
// plain requests, with max_tokens from 2 up (so some rejected picks are a
// request's last token, and grammar completion ends some), gives the tokens
// of step-by-step collection; the random model makes the grammar reject
// picks while the next step is in flight, so the roll-back runs. A second
// turn of each agent then reuses the first turn's KV (no position or KV
// drift from the discarded rows): its tokens are those of an engine that
// recomputes everything step by step.
TEST(EngineTest, PipelinedConstrainedStepsRollBackRejectedPicks) {
  const auto g = SmallJsonObjectGrammar();
  auto make = [&](bool pipeline, bool pipeline_grammar, bool prefix) {
    const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
    EngineOptions o = SmallOptions(c, 256);
    o.prefix_caching = prefix;
    o.pipeline = pipeline;
    o.pipeline_grammar = pipeline_grammar;
    o.optimistic_grammar = OptimisticGrammar::kOn;
    return CpuEngine(c, o);
  };
  auto request = [&](int i, std::vector<int32_t> prompt, const std::string& agent) {
    EngineRequest r = Greedy(std::move(prompt), 2 + 3 * i, agent);
    if (i % 4 != 3) {  // every fourth: unconstrained
      r.params.grammar = g;
      r.params.ignore_eos = false;
      r.params.stop_token_ids = {96};
    }
    if (i % 2 == 1) {
      r.params.temperature = 1.0f;
      r.params.seed = 70 + i;
    }
    return r;
  };
  constexpr int kRequests = 8;
  struct Turns {
    std::vector<std::vector<int32_t>> first, second;
    std::vector<int64_t> cached;
    EngineStats stats;
  };
  auto run = [&](bool pipeline, bool pipeline_grammar, bool prefix) {
    auto e = make(pipeline, pipeline_grammar, prefix);
    Turns t;
    std::vector<RequestHandle> hs;
    for (int i = 0; i < kRequests; ++i)
      hs.push_back(e->Submit(request(i, Range(3 + i, 6 + i), "agent" + std::to_string(i))).value());
    for (auto& h : hs) t.first.push_back(Collect(h).tokens);
    t.stats = e->Stats();
    hs.clear();
    for (int i = 0; i < kRequests; ++i) {
      std::vector<int32_t> prompt = Range(3 + i, 6 + i);
      prompt.insert(prompt.end(), t.first[i].begin(), t.first[i].end());
      prompt.insert(prompt.end(), {11, 12, 13});
      hs.push_back(e->Submit(request(i, prompt, "agent" + std::to_string(i))).value());
    }
    for (auto& h : hs) {
      Done d = Collect(h);
      t.second.push_back(std::move(d.tokens));
      t.cached.push_back(d.finished.cached_tokens);
    }
    return t;
  };
  const Turns stepwise = run(/*pipeline=*/false, false, /*prefix=*/false);
  const Turns held = run(/*pipeline=*/true, /*pipeline_grammar=*/false, true);
  const Turns piped = run(/*pipeline=*/true, /*pipeline_grammar=*/true, true);
  EXPECT_EQ(stepwise.stats.pipelined_steps, 0);
  EXPECT_GT(piped.stats.pipelined_steps, held.stats.pipelined_steps);
  EXPECT_GT(piped.stats.grammar_rejected_rows, 0);
  EXPECT_GT(piped.stats.grammar_rolled_back_rows, 0);
  EXPECT_LE(piped.stats.grammar_rolled_back_rows, piped.stats.grammar_rejected_rows);
  EXPECT_EQ(held.stats.grammar_rolled_back_rows, 0);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(piped.first[i], stepwise.first[i]) << "request " << i;
    EXPECT_EQ(held.first[i], stepwise.first[i]) << "request " << i;
    EXPECT_EQ(piped.second[i], stepwise.second[i]) << "second turn of request " << i;
    // The first turn's KV came from the agent (whole blocks of what it
    // computed: its prompt and all its output but the last token), as
    // without the roll-backs.
    const int64_t computed = 6 + i + static_cast<int64_t>(piped.first[i].size()) - 1;
    EXPECT_GE(piped.cached[i], computed / 4 * 4) << "second turn of request " << i;
    EXPECT_GT(piped.cached[i], 0) << "second turn of request " << i;
    EXPECT_EQ(piped.cached[i], held.cached[i]) << "second turn of request " << i;
    EXPECT_EQ(stepwise.cached[i], 0);
  }
  for (int i = 0; i < kRequests; ++i) {
    if (i % 4 == 3) continue;
    grammar::GrammarMatcher m(g);
    for (int32_t t : piped.first[i]) EXPECT_TRUE(m.Advance(t).ok()) << "request " << i;
  }
}

// A rejected optimistic pick whose kept row cannot be read back fails its
// request with the backend's error; the engine goes on, and the next
// request gets the masked-first tokens.
TEST(EngineTest, UnreadableKeptLogitsFailTheRejectedRequest) {
  const auto g = SmallJsonObjectGrammar();
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  auto cpu =
      backend::cpu::CpuBackend::Create(c, RandomWeights(c, 21), backend::cpu::CpuBackendOptions{2});
  ASSERT_TRUE(cpu.ok());
  auto wrapped = std::make_unique<testing::DeferredWriteBackend>(std::move(cpu).value(), 1);
  testing::DeferredWriteBackend* backend = wrapped.get();
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = 8;
  o.scheduler.max_step_tokens = 64;
  o.optimistic_grammar = OptimisticGrammar::kOn;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), 256);
  auto e = Engine::Create(std::move(wrapped), nullptr, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto request = [&] {
    EngineRequest r = Greedy(Range(3, 6), 12);
    r.params.grammar = g;
    r.params.ignore_eos = false;
    r.params.stop_token_ids = {96};
    return r;
  };
  // The first token must be "{": the random model's favourite is not, so
  // the first pick is rejected and its row read back.
  backend->FailNextReadKeptLogits();
  RequestHandle h = (*e)->Submit(request()).value();
  RequestOutput ev = h.stream->Pop();
  while (ev.kind == RequestOutput::Kind::kDelta) ev = h.stream->Pop();
  ASSERT_EQ(ev.kind, RequestOutput::Kind::kError);
  EXPECT_EQ(ev.error.code(), StatusCode::kIoError) << ev.error.ToString();
  EXPECT_GT((*e)->Stats().grammar_rejected_rows, 0);
  const Done ok = Collect((*e)->Submit(request()).value());
  EXPECT_FALSE(ok.tokens.empty());
  auto masked = MakeEngine(model::Architecture::kQwen3, 256);
  EngineRequest r = request();
  EXPECT_EQ(Collect(masked->Submit(std::move(r)).value()).tokens, ok.tokens);
}

}  // namespace
}  // namespace agentkv::engine
