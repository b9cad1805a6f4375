// Speculative decoding end to end on the CUDA backend (the engine over
// CudaBackend, small random models): greedy output with n-gram drafts
// equals the output without them, batched with plain decode rows (graph
// steps) and alone, pipelined. The GPU verifies a draft on the multi-token
// path (the step's rows through the prompt kernels) while plain decoding
// takes the one-token kernels, so their logits differ by bf16 rounding: the
// two outputs must agree up to the first position where they differ, and
// there the CPU backend's logits (fp32, same bf16 weights) must put both
// tokens within a near tie of the best (0.3 x the logits' RMS, the gap
// under which backend_test.cc counts a row undecided); and most tokens must have been compared.
// Sampled requests: drafted rows verified by the sample kernel, repeatable
// under a seed. (The CPU backend's exact equality is engine_speculative_test.cc's.) Lives beside
// the CUDA backend's tests so that the GPU machine's test stage runs it.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "backend_test_util.h"
#include "engine/engine.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;

std::vector<int32_t> Collect(const engine::RequestHandle& h) {
  std::vector<int32_t> out;
  while (true) {
    engine::RequestOutput ev = h.stream->Pop();
    if (ev.kind == engine::RequestOutput::Kind::kDelta) {
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      continue;
    }
    EXPECT_EQ(ev.kind, engine::RequestOutput::Kind::kFinished) << ev.error.ToString();
    return out;
  }
}

// A prompt that repeats itself (a file read, then quoted): its n-grams
// recur, so drafts are found from the first step.
std::vector<int32_t> Repetitive(int from, int n, int vocab) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((from + 7 * i) % vocab);
  const std::vector<int32_t> head = v;
  v.insert(v.end(), head.begin(), head.end());
  v.insert(v.end(), head.begin(), head.begin() + n / 2);
  return v;
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts, outputs;
  engine::EngineStats stats;
};

// Six greedy requests at once (prompts of 12 to 42 tokens, 20 to 55
// output tokens), then one alone, on an engine over a fresh CudaBackend.
Workload RunWorkload(const model::ModelConfig& c, const MapWeights& w, bool speculative,
                     int max_batch) {
  Workload wl;
  CudaBackendOptions bo;
  bo.max_step_tokens = 64;
  bo.max_batch = max_batch;
  auto backend = CudaBackend::Create(c, w, bo);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  if (!backend.ok()) return wl;
  engine::EngineOptions o;
  o.block_size = 8;
  o.scheduler.max_batch = max_batch;
  o.scheduler.max_step_tokens = 64;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kBF16).groups.size(), 256);
  if (speculative) o.speculative.mode = engine::SpeculativeMode::kNgram;
  auto e = engine::Engine::Create(std::move(backend).value(), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return wl;
  auto request = [&](std::vector<int32_t> prompt, int max_tokens) {
    engine::EngineRequest r;
    r.prompt = std::move(prompt);
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = max_tokens;
    return r;
  };
  std::vector<engine::RequestHandle> hs;
  for (int i = 0; i < 6; ++i) {
    engine::EngineRequest r = request(Repetitive(10 + i, 8 + 4 * i, c.vocab_size), 20 + 7 * i);
    wl.prompts.push_back(r.prompt);
    hs.push_back((*e)->Submit(r).value());
  }
  for (auto& h : hs) wl.outputs.push_back(Collect(h));
  engine::EngineRequest alone = request(Repetitive(3, 24, c.vocab_size), 60);
  wl.prompts.push_back(alone.prompt);
  wl.outputs.push_back(Collect((*e)->Submit(alone).value()));
  wl.stats = (*e)->Stats();
  return wl;
}

// How far below the best logit the CPU backend puts token `t` after
// `tokens`, over the logits' RMS (0 for the argmax).
double GapOverRms(Backend& cpu, const std::vector<int32_t>& tokens, int32_t t) {
  const model::ModelConfig& c = cpu.config();
  const int bs = cpu.kv_layout().block_size;
  Seq s;
  s.tokens = tokens;
  Pager pager(cpu.cache_spec(), bs);
  pager.Ensure(s, static_cast<int64_t>(tokens.size()));
  const SeqStep st = StepOf(s, static_cast<int>(tokens.size()), true);
  std::vector<float> logits(c.vocab_size);
  EXPECT_TRUE(cpu.Forward({&st, 1}, logits).ok());
  double ms = 0;
  for (float x : logits) ms += static_cast<double>(x) * x;
  const float best = *std::max_element(logits.begin(), logits.end());
  return (best - logits[static_cast<size_t>(t)]) / std::sqrt(ms / logits.size());
}

void ExpectSameUpToNearTies(const model::ModelConfig& c, const MapWeights& w, const Workload& plain,
                            const Workload& spec, const std::string& what) {
  ASSERT_EQ(plain.outputs.size(), spec.outputs.size()) << what;
  int64_t compared = 0, total = 0;
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    const std::vector<int32_t>& a = plain.outputs[i];
    const std::vector<int32_t>& b = spec.outputs[i];
    EXPECT_EQ(a.size(), b.size()) << what << " request " << i;
    const size_t n = std::min(a.size(), b.size());
    size_t j = 0;
    while (j < n && a[j] == b[j]) ++j;
    compared += static_cast<int64_t>(j);
    total += static_cast<int64_t>(a.size());
    if (j == n) continue;
    // (A fresh CPU backend per check: each forward starts at position 0.)
    auto cpu = MakeCpu(c, w, 16);
    std::vector<int32_t> prefix = plain.prompts[i];
    prefix.insert(prefix.end(), a.begin(), a.begin() + static_cast<int64_t>(j));
    // Both tokens within the near-tie gap of the best.
    for (const int32_t t : {a[j], b[j]}) {
      const double gap = GapOverRms(*cpu, prefix, t);
      EXPECT_LT(gap, 0.3) << what << " request " << i << " differs at token " << j << " (" << a[j]
                          << " without drafts, " << b[j] << " with): the CPU puts " << t << " "
                          << gap << " x RMS below the best";
    }
  }
  // Near ties are rare: most of the output must have been compared.
  EXPECT_GE(2 * compared, total) << what << ": only " << compared << " of " << total
                                 << " tokens before the first differences";
}

TEST(CudaEngineSpeculative, GreedyOutputIsTheSameWithDrafts) {
  AGENTKV_REQUIRE_GPU();
  for (const bool wide : {false, true}) {
    const model::ModelConfig c =
        wide ? WideConfig(model::Architecture::kQwen3) : SmallConfig(model::Architecture::kLlama);
    const MapWeights w = Bf16Weights(c, 51);
    for (const int max_batch : {8, 1}) {
      const std::string what =
          std::string(wide ? "wide qwen3" : "llama") + " max_batch " + std::to_string(max_batch);
      const Workload plain = RunWorkload(c, w, false, max_batch);
      EXPECT_EQ(plain.stats.draft_tokens, 0) << what;
      // The engine reports its backend's graph steps: decode steps without
      // drafts replay the graphs Reserve captured.
      EXPECT_GT(plain.stats.graph_steps, 0) << what;
      EXPECT_LE(plain.stats.graph_steps, plain.stats.steps) << what;
      const Workload spec = RunWorkload(c, w, true, max_batch);
      EXPECT_GT(spec.stats.draft_tokens, 0) << what;
      EXPECT_GT(spec.stats.draft_accepted_tokens, 0) << what;
      EXPECT_LE(spec.stats.draft_accepted_tokens, spec.stats.draft_tokens) << what;
      // Accepted drafts save steps (alone: every one; batched, where the
      // longest request sets the count, none may be saved).
      if (max_batch == 1) {
        EXPECT_LT(spec.stats.steps, plain.stats.steps) << what;
      } else {
        EXPECT_LE(spec.stats.steps, plain.stats.steps) << what;
      }
      std::printf("%s: %lld steps without drafts, %lld with; %lld of %lld draft tokens accepted\n",
                  what.c_str(), static_cast<long long>(plain.stats.steps),
                  static_cast<long long>(spec.stats.steps),
                  static_cast<long long>(spec.stats.draft_accepted_tokens),
                  static_cast<long long>(spec.stats.draft_tokens));
      ExpectSameUpToNearTies(c, w, plain, spec, what);
    }
  }
}

// Sampled requests with drafts: the drafted rows are verified by the sample
// kernel (RowPick::draft), only picks come back; drafts are accepted at a
// low temperature (the model is then nearly greedy, and greedy drafts are
// accepted above), the outputs have their lengths, and the same seeds give
// the same tokens on a fresh backend (the uniforms come from the seeded
// Sampler, 2k + 1 per drafted step, and the kernel is deterministic).
// (That the kernel's verdicts are the CPU reference's is
// sample_kernel_test.cc's; that they keep the distribution,
// draft_verify_test.cc's.)
TEST(CudaEngineSpeculative, SampledDraftsAreVerifiedOnTheDeviceAndRepeat) {
  AGENTKV_REQUIRE_GPU();
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = Bf16Weights(c, 51);
  // One seeded request alone on a fresh engine: nothing else shapes its
  // steps, so two runs draft alike.
  auto run = [&](float temperature, engine::EngineStats* st) {
    CudaBackendOptions bo;
    bo.max_step_tokens = 64;
    bo.max_batch = 1;
    auto backend = CudaBackend::Create(c, w, bo);
    EXPECT_TRUE(backend.ok()) << backend.status().ToString();
    engine::EngineOptions o;
    o.block_size = 8;
    o.scheduler.max_batch = 1;
    o.scheduler.max_step_tokens = 64;
    o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kBF16).groups.size(), 256);
    o.speculative.mode = engine::SpeculativeMode::kNgram;
    auto e = std::move(engine::Engine::Create(std::move(backend).value(), nullptr, o).value());
    engine::EngineRequest r;
    r.prompt = Repetitive(3, 24, c.vocab_size);
    r.params.temperature = temperature;
    r.params.seed = 7;
    r.params.ignore_eos = true;
    r.params.max_tokens = 60;
    std::vector<int32_t> out = Collect(e->Submit(r).value());
    *st = e->Stats();
    return out;
  };
  for (const float t : {0.05f, 1.0f}) {
    engine::EngineStats sa, sb;
    const std::vector<int32_t> a = run(t, &sa), b = run(t, &sb);
    EXPECT_EQ(a.size(), 60u) << t;
    EXPECT_EQ(a, b) << "temperature " << t;
    EXPECT_GT(sa.draft_tokens, 0) << t;
    if (t < 0.5f) {
      EXPECT_GT(sa.draft_accepted_tokens, 0) << t;
    }
    EXPECT_LE(sa.draft_accepted_tokens, sa.draft_tokens) << t;
    std::printf("temperature %.2f: %lld of %lld draft tokens accepted\n", t,
                static_cast<long long>(sa.draft_accepted_tokens),
                static_cast<long long>(sa.draft_tokens));
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaEngineSpeculative, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
