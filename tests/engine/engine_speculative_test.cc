// Speculative decoding from the context, end to end on the CPU backend with
// small random models: greedy output identical with and without drafts
// across batching, chunked prefill, preemption, stop tokens, length limits
// and agents' turns (whose cached prefix must hold only verified tokens);
// the per-request opt-out; the stats. (That sampled verification keeps the
// distribution is tested on VerifySampledDraft, draft_verify_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/finish_reason.h"
#include "test_model.h"

namespace agentkv::engine {
namespace {

using testing::MapWeights;
using testing::RandomWeights;
using testing::SmallConfig;

struct Out {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  int64_t completion = 0;
  int64_t cached = 0;
};

Out Collect(const RequestHandle& h) {
  Out o;
  while (true) {
    RequestOutput ev = h.stream->Pop();
    if (ev.kind == RequestOutput::Kind::kDelta) {
      o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      continue;
    }
    EXPECT_EQ(ev.kind, RequestOutput::Kind::kFinished) << ev.error.ToString();
    o.finish = ev.finish;
    o.completion = ev.completion_tokens;
    o.cached = ev.cached_tokens;
    return o;
  }
}

struct Config {
  model::Architecture arch = model::Architecture::kQwen3;
  bool speculative = false;
  int max_batch = 8;
  int step_tokens = 64;
  int blocks = 256;
  bool pipeline = true;
  int compute_bound_tokens = 32;
};

std::unique_ptr<Engine> MakeEngine(const Config& s) {
  const model::ModelConfig c = SmallConfig(s.arch);
  const MapWeights w = RandomWeights(c, 21);
  auto cpu = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{2});
  EXPECT_TRUE(cpu.ok());
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = s.max_batch;
  o.scheduler.max_step_tokens = s.step_tokens;
  o.pipeline = s.pipeline;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), s.blocks);
  if (s.speculative) {
    o.speculative.mode = SpeculativeMode::kNgram;
    o.speculative.compute_bound_tokens = s.compute_bound_tokens;
  }
  auto e = Engine::Create(std::move(cpu).value(), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
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

// A prompt that repeats itself (a file read, then quoted): its n-grams recur.
std::vector<int32_t> Repetitive(int from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((from + 7 * i) % 97);
  const std::vector<int32_t> head = v;
  v.insert(v.end(), head.begin(), head.end());
  v.insert(v.end(), head.begin(), head.begin() + n / 2);
  return v;
}

// Every request of a mixed workload, in submission order, then an agent's
// two turns.
std::vector<Out> RunWorkload(const Config& s, EngineStats* stats, int32_t stop_id = -1) {
  auto e = MakeEngine(s);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(Greedy(Repetitive(10 + i, 4 + 2 * i), 5 + 7 * i));
  EngineRequest stopped = Greedy(Repetitive(40, 6), 30, "stopper");
  if (stop_id >= 0) stopped.params.stop_token_ids = {stop_id};
  reqs.push_back(stopped);
  std::vector<RequestHandle> hs;
  for (auto& r : reqs) hs.push_back(e->Submit(r).value());
  std::vector<Out> outs;
  for (auto& h : hs) outs.push_back(Collect(h));
  // The stopped agent's next turn: its KV ends where its output did (a
  // stop token inside an accepted draft cuts it there).
  std::vector<int32_t> next = stopped.prompt;
  next.insert(next.end(), outs.back().tokens.begin(), outs.back().tokens.end());
  next.push_back(3);
  outs.push_back(Collect(e->Submit(Greedy(next, 10, "stopper")).value()));
  std::vector<int32_t> turn = Repetitive(5, 8);
  Out t1 = Collect(e->Submit(Greedy(turn, 25, "agent")).value());
  turn.insert(turn.end(), t1.tokens.begin(), t1.tokens.end());
  turn.push_back(2);
  Out t2 = Collect(e->Submit(Greedy(turn, 20, "agent")).value());
  outs.push_back(t1);
  outs.push_back(t2);
  *stats = e->Stats();
  // Nothing is left referenced but the agent's pinned blocks' owners.
  EXPECT_EQ(stats->running, 0);
  return outs;
}

void ExpectSame(const std::vector<Out>& got, const std::vector<Out>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << " request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << " request " << i;
    EXPECT_EQ(got[i].completion, want[i].completion) << what << " request " << i;
    EXPECT_EQ(got[i].completion, static_cast<int64_t>(got[i].tokens.size())) << what;
    // (A small pool's evictions depend on when requests arrive.)
    if (std::string(what) != "small pool") {
      EXPECT_EQ(got[i].cached, want[i].cached) << what << " request " << i;
    }
  }
}

TEST(EngineSpeculativeTest, GreedyOutputIsIdenticalWithDrafts) {
  for (model::Architecture arch :
       {model::Architecture::kQwen3, model::Architecture::kGemma3, model::Architecture::kLlama}) {
    SCOPED_TRACE(static_cast<int>(arch));
    Config plain;
    plain.arch = arch;
    EngineStats st;
    const std::vector<Out> want = RunWorkload(plain, &st);
    EXPECT_EQ(st.draft_tokens, 0);
    // A stop token met inside an accepted draft: the token the third
    // request emits at its 12th position.
    const int32_t stop_id = want[2].tokens.size() > 12 ? want[2].tokens[12] : -1;
    const std::vector<Out> want_stop = RunWorkload(plain, &st, stop_id);

    Config spec = plain;
    spec.speculative = true;
    ExpectSame(RunWorkload(spec, &st), want, "batched");
    EXPECT_GT(st.draft_tokens, 0);
    EXPECT_GT(st.draft_accepted_tokens, 0);
    EXPECT_LE(st.draft_accepted_tokens, st.draft_tokens);
    // The agent's second turn found its first turn's verified KV (models
    // with sliding windows keep no prefix cache).
    EXPECT_EQ(RunWorkload(spec, &st).back().cached, want.back().cached);
    if (arch != model::Architecture::kGemma3) {
      EXPECT_GT(want.back().cached, 0);
    }
    ExpectSame(RunWorkload(spec, &st, stop_id), want_stop, "stop token");

    Config one = spec;  // one sequence at a time
    one.max_batch = 1;
    ExpectSame(RunWorkload(one, &st), want, "alone");
    EXPECT_GT(st.draft_accepted_tokens, 0);
    Config chunked = spec;  // prefill in chunks of 5
    chunked.step_tokens = 5;
    ExpectSame(RunWorkload(chunked, &st), want, "chunked");
    Config serial = spec;
    serial.pipeline = false;
    ExpectSame(RunWorkload(serial, &st), want, "not pipelined");
    Config small = spec;  // preemptions
    small.blocks = 24;
    small.max_batch = 6;
    ExpectSame(RunWorkload(small, &st), want, "small pool");
    EXPECT_GT(st.preemptions, 0);
  }
}

TEST(EngineSpeculativeTest, AComputeBoundBatchIsNotDrafted) {
  Config s;
  s.speculative = true;
  s.compute_bound_tokens = 2;  // two sequences decoding already reach it
  auto e = MakeEngine(s);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(e->Submit(Greedy(Repetitive(3 + i, 6), 20)).value());
  for (auto& h : hs) Collect(h);
  // Only once at most one sequence is left decoding may it be drafted for.
  const EngineStats st = e->Stats();
  EXPECT_LE(st.draft_steps, 20);
  s.compute_bound_tokens = 0;
  auto off = MakeEngine(s);
  Collect(off->Submit(Greedy(Repetitive(3, 6), 20)).value());
  EXPECT_EQ(off->Stats().draft_tokens, 0);
}

TEST(EngineSpeculativeTest, RequestsThatOptOutOrNeedTheSamplerAreNotDrafted) {
  Config s;
  s.speculative = true;
  auto e = MakeEngine(s);
  EngineRequest out = Greedy(Repetitive(3, 6), 20);
  out.params.speculative = false;
  EngineRequest penalised = Greedy(Repetitive(3, 6), 20);
  penalised.params.frequency_penalty = 1e-30f;  // changes no logit here
  EngineRequest logprobs = Greedy(Repetitive(3, 6), 20);
  logprobs.params.logprobs = 1;
  const Out a = Collect(e->Submit(out).value());
  const Out b = Collect(e->Submit(penalised).value());
  const Out c = Collect(e->Submit(logprobs).value());
  EXPECT_EQ(e->Stats().draft_tokens, 0);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens, c.tokens);
  // The same request drafted for gives the same tokens.
  const Out d = Collect(e->Submit(Greedy(Repetitive(3, 6), 20)).value());
  EXPECT_GT(e->Stats().draft_tokens, 0);
  EXPECT_EQ(d.tokens, a.tokens);
}

// Sampled requests are verified by rejection sampling: they run to their
// length with drafts accepted, and a seeded request repeats itself.
TEST(EngineSpeculativeTest, SampledRequestsAreDraftedAndRepeatable) {
  Config s;
  s.speculative = true;
  auto run = [&](EngineStats* st) {
    auto e = MakeEngine(s);
    EngineRequest r = Greedy(Repetitive(3, 8), 40);
    r.params.temperature = 0.05f;  // close to greedy: the context predicts it
    r.params.seed = 11;
    const Out o = Collect(e->Submit(r).value());
    *st = e->Stats();
    return o;
  };
  EngineStats st1, st2;
  const Out a = run(&st1), b = run(&st2);
  EXPECT_EQ(a.tokens.size(), 40u);
  EXPECT_EQ(a.finish, FinishReason::kLength);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(st1.draft_tokens, 0);
  EXPECT_GT(st1.draft_accepted_tokens, 0);
}

// The engine's sampled verification keeps the model's distribution: on a
// model of 8 tokens (so that drafts are found and often accepted), the
// second output token of 3000 seeded requests (drafted for and verified),
// given the first, follows
// softmax of the logits a plain forward pass gives for prompt + first
// token. Each conditional frequency rests on ~375 draws (standard
// deviation below 0.026); the tolerance is 0.12, and the seeds are fixed,
// so the counts are the same on every run.
TEST(EngineSpeculativeTest, SampledDraftsKeepTheModelsDistribution) {
  model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  c.vocab_size = 8;
  const MapWeights w = RandomWeights(c, 5);
  const std::vector<int32_t> prompt = {1, 5, 2, 7, 3, 3, 0, 6, 4, 1, 2, 5, 7, 0};
  // The exact conditionals p(second | first).
  std::vector<std::vector<double>> exact(8);
  {
    auto cpu = std::move(
        backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{2}).value());
    backend::KvLayout layout;
    layout.block_size = 64;
    layout.blocks_per_group[0] = 1;
    ASSERT_TRUE(cpu->AllocateKv(layout).ok());
    const std::vector<int32_t> table = {0};
    std::vector<float> logits(8);
    for (int32_t first = 0; first < 8; ++first) {
      std::vector<int32_t> seq = prompt;
      seq.push_back(first);
      backend::SeqStep st;
      st.tokens = seq;
      st.want_logits = true;
      st.block_tables[0] = table;
      ASSERT_TRUE(cpu->Forward({&st, 1}, logits).ok());
      const float m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float l : logits) sum += std::exp(static_cast<double>(l - m));
      for (float l : logits) exact[first].push_back(std::exp(static_cast<double>(l - m)) / sum);
    }
  }
  // Room for all requests in one batch and a step budget for every draft.
  const int n = 3000;
  auto cpu = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{2});
  ASSERT_TRUE(cpu.ok());
  EngineOptions o;
  o.block_size = 4;
  o.scheduler.max_batch = n;
  o.scheduler.max_step_tokens = n * static_cast<int>(prompt.size() + 2);
  o.blocks_per_group = {6 * n};
  o.speculative.mode = SpeculativeMode::kNgram;
  o.speculative.compute_bound_tokens = 4 * n;
  auto e = std::move(Engine::Create(std::move(cpu).value(), nullptr, o).value());
  std::vector<RequestHandle> hs;
  for (int i = 0; i < n; ++i) {
    // Three tokens: room for a draft of one (and the bonus) after the first.
    EngineRequest r = Greedy(prompt, 3);
    r.params.temperature = 1.0f;
    r.params.seed = static_cast<uint64_t>(i) + 1;
    hs.push_back(e->Submit(r).value());
  }
  std::vector<std::vector<double>> count(8, std::vector<double>(8, 0));
  std::vector<double> total(8, 0);
  for (auto& h : hs) {
    const Out out = Collect(h);
    ASSERT_EQ(out.tokens.size(), 3u);
    count[out.tokens[0]][out.tokens[1]] += 1;
    total[out.tokens[0]] += 1;
  }
  const EngineStats st = e->Stats();
  // How many second tokens were drafted for depends on how requests
  // arrived (a step admitting new ones drafts nothing); at least the last
  // ones admitted decode alone and are drafted for (the prompt holds every
  // token, so a draft is always found).
  EXPECT_GT(st.draft_tokens, 0);
  for (int32_t first = 0; first < 8; ++first) {
    if (total[first] < 200) continue;  // too rare a first token to judge
    for (int32_t second = 0; second < 8; ++second)
      EXPECT_NEAR(count[first][second] / total[first], exact[first][second], 0.12)
          << first << " -> " << second << " over " << total[first];
  }
}

}  // namespace
}  // namespace agentkv::engine
