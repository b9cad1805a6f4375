// CudaBackend's drafted steps (several logits rows per sequence:
// speculative verification, SeqStep::logit_rows) against CpuBackend on the
// small random models of tests/engine/test_model.h. Sequences run their
// last token and a draft beside plain decode rows; after each step a
// sequence keeps only part of its draft, so the next step writes its K/V
// over the rejected positions (as the engine does). Both backends are fed
// the same tokens, so every row compares the same inputs, with
// backend_test.cc's tolerances: relative L2 error at most 6e-2 on any row
// and 2e-2 on average, and the same argmax on every row whose CPU top-two
// gap exceeds 0.3 x the logits' RMS. Then the picks of such steps on the
// GPU (greedy, drawn, logprobs, host rows) against the logits Forward gives
// for the same step, the rows capacity growing past its reserve, and a
// pipelined step naming a row of a drafted step by prev_row.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include "backend_test_util.h"
#include "engine/backend/row_logprobs.h"
#include "engine/backend/sample_draw.h"
#include "engine/draft_verify.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;

using Rows = std::vector<std::vector<float>>;

int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// The tolerances above (bf16 KV), and the share of rows that must be
// decisive to judge. An fp8 KV cache rounds keys and values far more:
// backend_fp8_test.cc's 0.3 per row, 0.1 on average and a gap of 0.5 x RMS
// (which a sixth of these rows clear). Mixture-of-experts models run
// with FixRouting's routers (a random router flips experts under bf16
// noise; see backend_test_util.h), so they take the dense bar.
struct Tolerance {
  double row = 6e-2, mean = 2e-2, gap = 0.3, decisive = 1.0 / 3;
};
Tolerance ToleranceFor(cache::KvDtype kv, const model::ModelConfig&) {
  if (kv == cache::KvDtype::kFP8E4M3) return Tolerance{0.3, 0.1, 0.5, 1.0 / 6};
  return Tolerance{};
}

// Rows `got` against the CPU's `ref`; returns how many rows were decisive.
int ExpectRowsMatch(const Rows& got, const Rows& ref, const std::string& what, Tolerance tol = {}) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  double worst = 0, sum = 0;
  int decisive = 0, over = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double e = RelErr(got[i], ref[i]);
    worst = std::max(worst, e);
    sum += e;
    over += e >= tol.row;
    EXPECT_LT(e, tol.row) << what << " row " << i;
    std::vector<float> sorted = ref[i];
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double ms = 0;
    for (float x : ref[i]) ms += static_cast<double>(x) * x;
    if (sorted[0] - sorted[1] > tol.gap * std::sqrt(ms / ref[i].size())) {
      ++decisive;
      EXPECT_EQ(Argmax(got[i]), Argmax(ref[i])) << what << " row " << i;
    }
  }
  EXPECT_LT(sum / std::max<size_t>(ref.size(), 1), tol.mean) << what << ": mean logits error";
  std::printf("%s: %zu rows, worst rel err %.2e, %d past %.2g, %d decisive\n", what.c_str(),
              ref.size(), worst, over, tol.row, decisive);
  return decisive;
}

// The sequences of a drafted run: prompts of 45, 20 and 3 tokens (as many
// as `drafts` has entries, cycling), random in the vocabulary.
std::vector<Seq> Prompts(const model::ModelConfig& c, size_t n, std::mt19937& rng) {
  const int lens[] = {45, 20, 3};
  std::vector<Seq> seqs(n);
  for (size_t i = 0; i < n; ++i)
    for (int j = 0; j < lens[i % 3]; ++j)
      seqs[i].tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
  return seqs;
}

// Prefills every prompt of `seqs` but its last token in one step.
void Prefill(Backend& b, std::vector<Seq>& seqs, Pager& pager) {
  std::vector<SeqStep> steps;
  for (Seq& s : seqs) {
    const int n = static_cast<int>(s.tokens.size()) - 1;
    if (n <= 0) continue;
    pager.Ensure(s, n);
    steps.push_back(StepOf(s, n, false));
  }
  std::vector<float> none;
  ASSERT_TRUE(b.Forward(steps, none).ok());
  for (Seq& s : seqs) s.computed = std::max(0, static_cast<int>(s.tokens.size()) - 1);
}

// Appends drafts[i] random tokens to each prefilled sequence of `seqs`,
// maps their blocks, and returns the step that runs each sequence's next
// token and its draft with a logits row each (logit_rows = drafts[i] + 1).
std::vector<SeqStep> DraftedStep(std::vector<Seq>& seqs, Pager& pager,
                                 const std::vector<int>& drafts, int vocab, std::mt19937& rng) {
  std::vector<SeqStep> steps;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int j = 0; j < drafts[i]; ++j)
      seqs[i].tokens.push_back(static_cast<int32_t>(rng() % vocab));
    pager.Ensure(seqs[i], static_cast<int64_t>(seqs[i].tokens.size()));
    SeqStep st = StepOf(seqs[i], drafts[i] + 1, true);
    st.logit_rows = drafts[i] + 1;
    steps.push_back(st);
  }
  return steps;
}

// What the tests of single steps start from: a CUDA backend (MakeCuda,
// blocks of 16) on a small random model (Bf16Weights from weight_seed),
// and prompts (Prompts, drawn from `rng` seeded with `seed`) prefilled but
// for their last tokens, their blocks from `pager`.
struct Prefilled {
  model::ModelConfig c;
  MapWeights w;
  std::unique_ptr<CudaBackend> b;
  std::mt19937 rng;
  std::vector<Seq> seqs;
  std::optional<Pager> pager;
};
// Fills *p as above with n prompts of `c`; a failure stops the test
// (ASSERT_NO_FATAL_FAILURE).
void StartPrefilled(const model::ModelConfig& c, uint32_t weight_seed, uint32_t seed, size_t n,
                    Prefilled* p) {
  p->c = c;
  p->w = Bf16Weights(c, weight_seed);
  p->b = MakeCuda(p->c, p->w, 16);
  ASSERT_TRUE(p->b);
  p->rng.seed(seed);
  p->seqs = Prompts(p->c, n, p->rng);
  p->pager.emplace(p->b->cache_spec(), 16);
  Prefill(*p->b, p->seqs, *p->pager);
}

// A drafted step of three prefilled prompts (StartPrefilled; Llama, or the
// wide Qwen3 shape, WideConfig, with its fused-argmax LM head on CC 9.0):
// the first sequence's next token and a draft of 4, the second's token
// alone, the third's and a draft of 3 (DraftedStep: 10 rows), and the
// logits Forward gives for it.
struct DraftedRun : Prefilled {
  std::vector<int> drafts = {4, 0, 3};
  std::vector<SeqStep> steps;
  int rows = 5 + 1 + 4;
  std::vector<float> logits;
};
void StartDrafted(bool wide, uint32_t weight_seed, uint32_t seed, DraftedRun* d) {
  const model::ModelConfig c =
      wide ? WideConfig(model::Architecture::kQwen3) : SmallConfig(model::Architecture::kLlama);
  ASSERT_NO_FATAL_FAILURE(StartPrefilled(c, weight_seed, seed, 3, d));
  d->steps = DraftedStep(d->seqs, *d->pager, d->drafts, c.vocab_size, d->rng);
  d->logits.assign(static_cast<size_t>(d->rows) * c.vocab_size, NAN);
  ASSERT_TRUE(d->b->Forward(d->steps, d->logits).ok());
}

// Appends, for `rounds` steps, sequence i's next token and a draft of
// drafts[i] tokens (random: both backends get the same), runs them with a
// logits row each (logit_rows = drafts[i] + 1), then keeps the token and
// (round + i) % (drafts[i] + 1) of the draft: the rest is dropped and its
// K/V overwritten by the next step. Returns every logits row in order.
Rows DriveDrafts(Backend& b, const std::vector<int>& drafts, int rounds, uint32_t seed) {
  const model::ModelConfig& c = b.config();
  std::mt19937 rng(seed);
  std::vector<Seq> seqs = Prompts(c, drafts.size(), rng);
  Pager pager(b.cache_spec(), b.kv_layout().block_size);
  Prefill(b, seqs, pager);
  Rows out;
  for (int round = 0; round < rounds; ++round) {
    int rows = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      // Only the last prompt token is pending in round 0.
      const int add = round == 0 ? drafts[i] : drafts[i] + 1;
      for (int j = 0; j < add; ++j) s.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      pager.Ensure(s, static_cast<int64_t>(s.tokens.size()));
      rows += drafts[i] + 1;
    }
    std::vector<SeqStep> steps;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      const int n = static_cast<int>(s.tokens.size()) - s.computed;
      SeqStep st = StepOf(s, n, true);
      st.logit_rows = drafts[i] + 1;
      steps.push_back(st);
    }
    std::vector<float> logits(static_cast<size_t>(rows) * c.vocab_size, NAN);
    EXPECT_TRUE(b.Forward(steps, logits).ok());
    for (int r = 0; r < rows; ++r)
      out.emplace_back(logits.begin() + static_cast<int64_t>(r) * c.vocab_size,
                       logits.begin() + static_cast<int64_t>(r + 1) * c.vocab_size);
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      const int keep = 1 + static_cast<int>((round + i) % (drafts[i] + 1));
      s.computed += keep;
      s.tokens.resize(s.computed);
    }
  }
  return out;
}

struct DraftCase {
  model::Architecture arch;
  int block_size;
  bool wide;
  // Draft tokens per sequence (0: a plain decode row). Rows per step: 9
  // (the LM head of 8+ rows), 5 (3 to 7 rows) and 2 (the GEMVs).
  std::vector<int> drafts;
  cache::KvDtype kv = cache::KvDtype::kBF16;
};

std::string DraftCaseName(const ::testing::TestParamInfo<DraftCase>& info) {
  const DraftCase& d = info.param;
  std::string s = CaseName({d.arch, 0, d.block_size, d.wide});
  for (int k : d.drafts) s += "_d" + std::to_string(k);
  if (d.kv == cache::KvDtype::kFP8E4M3) s += "_fp8";
  return s;
}

class CudaDraftedRows : public ::testing::TestWithParam<DraftCase> {};

TEST_P(CudaDraftedRows, LogitsMatchTheCpu) {
  AGENTKV_REQUIRE_GPU();
  const DraftCase dc = GetParam();
  const model::ModelConfig c = dc.wide ? WideConfig(dc.arch) : SmallConfig(dc.arch);
  MapWeights w = Bf16Weights(c, 31);
  if (c.IsMoe()) FixRouting(c, &w);  // the dense bar (backend_test_util.h)
  // (The CPU reference keeps the same cache format: f32, or e4m3.)
  auto cpu =
      MakeCpu(c, w, dc.block_size,
              dc.kv == cache::KvDtype::kFP8E4M3 ? cache::KvDtype::kFP8E4M3 : cache::KvDtype::kF32);
  auto gpu = MakeCuda(c, w, dc.block_size, true, dc.kv);
  ASSERT_TRUE(gpu);
  EXPECT_TRUE(gpu->multi_logit_rows());
  const Rows ref = DriveDrafts(*cpu, dc.drafts, 6, 3);
  const Rows got = DriveDrafts(*gpu, dc.drafts, 6, 3);
  const Tolerance tol = ToleranceFor(dc.kv, c);
  const int decisive = ExpectRowsMatch(got, ref, DraftCaseName({dc, 0}), tol);
  EXPECT_GE(decisive, tol.decisive * static_cast<double>(ref.size()))
      << "too few decisive rows to judge";
  // Drafted steps never run as graphs.
  EXPECT_EQ(gpu->graph_steps(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, CudaDraftedRows,
    ::testing::Values(
        DraftCase{model::Architecture::kLlama, 16, false, {4, 0, 2}},
        DraftCase{model::Architecture::kLlama, 16, false, {1}},
        DraftCase{model::Architecture::kQwen3, 8, false, {2, 1}},
        DraftCase{model::Architecture::kQwen3, 16, true, {4, 0, 2}},
        DraftCase{model::Architecture::kQwen3, 16, true, {2, 1}},
        DraftCase{model::Architecture::kQwen3, 16, true, {1}},
        // Sliding-window rings (drafts below the block size,
        // as the engine clamps them).
        DraftCase{model::Architecture::kGemma3, 4, false, {3, 0, 2}},
        DraftCase{model::Architecture::kGemma3, 8, true, {4, 0, 2}},
        DraftCase{model::Architecture::kGptOss, 8, false, {4, 0, 2}},
        DraftCase{model::Architecture::kQwen3Moe, 16, false, {4, 0, 2}},
        // The fp8 KV cache (its own attention and K/V store).
        DraftCase{model::Architecture::kLlama, 16, false, {4, 0, 2}, cache::KvDtype::kFP8E4M3},
        DraftCase{model::Architecture::kGemma3, 8, false, {4, 0, 2}, cache::KvDtype::kFP8E4M3}),
    DraftCaseName);

// The picks of a drafted step on the GPU: kGreedy rows are the argmax of
// the logits Forward gives for the same step, kHost rows get those logits,
// kDevice rows SampleDraw's token (or one a 1e-6 move of u changes the
// CPU's pick to: float rounding may decide there), and rows asking
// logprobs ComputeRowLogprobs of those logits; rows asking none count -1.
// On both LM-head paths (the wide model's fused argmax on CC 9.0).
TEST(CudaBackend, DraftedStepsPickEachRowAsPlanned) {
  AGENTKV_REQUIRE_GPU();
  for (const bool wide : {false, true}) {
    DraftedRun d;
    ASSERT_NO_FATAL_FAILURE(StartDrafted(wide, 37, 5, &d));
    const int V = d.c.vocab_size, n = d.rows;
    auto row = [&](int r) { return std::span<const float>(d.logits.data() + r * V, V); };
    // All greedy (the engine's greedy verification): the picks only.
    {
      std::vector<RowPick> plan(n);
      for (RowPick& p : plan) p.mode = PickMode::kGreedy;
      std::vector<int32_t> toks(n, -1);
      std::vector<float> scratch(static_cast<size_t>(n) * V);
      ASSERT_TRUE(d.b->ForwardSampled(d.steps, plan, toks, scratch).ok());
      for (int r = 0; r < n; ++r) EXPECT_EQ(toks[r], Argmax(row(r))) << "wide " << wide << " " << r;
    }
    // Mixed: the first sequence's rows host, greedy with logprobs, drawn
    // (with and without logprobs), greedy; the decode row drawn; the last
    // sequence's rows greedy and host.
    std::vector<RowPick> plan(n);
    const PickMode modes[] = {PickMode::kHost,   PickMode::kGreedy, PickMode::kDevice,
                              PickMode::kDevice, PickMode::kGreedy, PickMode::kDevice,
                              PickMode::kGreedy, PickMode::kHost,   PickMode::kGreedy,
                              PickMode::kHost};
    for (int r = 0; r < n; ++r) {
      plan[r].mode = modes[r];
      plan[r].sample.temperature = 0.6f + 0.1f * r;
      plan[r].sample.top_k = r % 2 ? 0 : 7;
      plan[r].sample.top_p = r % 3 ? 1.0f : 0.9f;
      plan[r].sample.u = 0.13 + 0.08 * r;
    }
    plan[1].logprobs = 3;
    plan[2].logprobs = 5;
    plan[6].logprobs = 0;
    std::vector<int32_t> toks(n, -1);
    std::vector<float> got(static_cast<size_t>(n) * V, NAN);
    ASSERT_TRUE(d.b->ForwardSampled(d.steps, plan, toks, got).ok());
    const std::span<const RowLogprobs> lps = d.b->collected_logprobs();
    ASSERT_EQ(lps.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const std::string what = "wide " + std::to_string(wide) + " row " + std::to_string(r);
      if (plan[r].mode == PickMode::kHost) {
        EXPECT_LT(RelErr(std::span<const float>(got.data() + r * V, V), row(r)), 1e-6) << what;
      } else if (plan[r].mode == PickMode::kGreedy) {
        EXPECT_EQ(toks[r], Argmax(row(r))) << what;
      } else {
        std::vector<float> buf(row(r).begin(), row(r).end());
        const int32_t want = SampleDraw(buf, plan[r].sample);
        if (toks[r] != want) {
          bool near = false;
          for (double f : {1 - 1e-6, 1 + 1e-6}) {
            SampleSettings s = plan[r].sample;
            s.u *= f;
            buf.assign(row(r).begin(), row(r).end());
            near = near || SampleDraw(buf, s) != want;
          }
          EXPECT_TRUE(near) << what << ": gpu " << toks[r] << " cpu " << want;
        }
      }
      if (plan[r].mode == PickMode::kHost || plan[r].logprobs < 0) {
        EXPECT_EQ(lps[r].count, -1) << what;
        continue;
      }
      const double scale =
          plan[r].mode == PickMode::kDevice ? 1.0 / plan[r].sample.temperature : 1.0;
      const RowLogprobs ref =
          ComputeRowLogprobs(d.logits.data() + r * V, V, scale, plan[r].logprobs, toks[r]);
      ASSERT_EQ(lps[r].count, ref.count) << what;
      for (int k = 0; k < ref.count; ++k) {
        EXPECT_EQ(lps[r].ids[k], ref.ids[k]) << what << " k " << k;
        EXPECT_NEAR(lps[r].logprobs[k], ref.logprobs[k], 1e-4) << what;
      }
      EXPECT_NEAR(lps[r].chosen, ref.chosen, 1e-4) << what;
    }
  }
}

// Device-picked rows that keep their logits (RowPick::keep_logits: an
// optimistic pick of a grammar-constrained row) are read back once the
// step is collected (ReadKeptLogits): the logits Forward gives for the
// same step, greedy rows (a decode step: a CUDA graph, the argmax in the
// LM head's epilogue, which stores the logits only for such steps) and a
// drawn one alike; the greedy picks are those rows' argmaxes. Refused for a
// row out of range, and once a step that kept nothing has run.
TEST(CudaBackend, KeptRowsAreReadBackAfterTheStep) {
  AGENTKV_REQUIRE_GPU();
  Prefilled p;
  ASSERT_NO_FATAL_FAILURE(StartPrefilled(SmallConfig(model::Architecture::kLlama), 41, 9, 4, &p));
  const int V = p.c.vocab_size;
  CudaBackend* b = p.b.get();
  EXPECT_TRUE(b->reads_kept_logits());
  EXPECT_TRUE(b->picks_on_device());
  std::vector<SeqStep> steps;
  for (Seq& s : p.seqs) {
    p.pager->Ensure(s, static_cast<int64_t>(s.tokens.size()));
    steps.push_back(StepOf(s, 1, true));
  }
  const int n = 4;
  std::vector<float> ref(static_cast<size_t>(n) * V, NAN);
  ASSERT_TRUE(b->Forward(steps, ref).ok());
  std::vector<RowPick> plan(n);
  for (RowPick& p : plan) p.mode = PickMode::kGreedy;
  plan[0].keep_logits = 1;
  plan[2].mode = PickMode::kDevice;
  plan[2].keep_logits = 1;
  plan[2].sample.temperature = 0.8f;
  plan[2].sample.u = 0.4;
  plan[3].keep_logits = 1;
  std::vector<int32_t> toks(n, -1);
  std::vector<float> got(static_cast<size_t>(n) * V, NAN);
  ASSERT_TRUE(b->ForwardSampled(steps, plan, toks, got).ok());
  const std::vector<int32_t> kept = {0, 2, 3};
  ASSERT_TRUE(b->ReadKeptLogits(kept, got).ok());
  for (int32_t r : kept) {
    const std::span<const float> row(got.data() + r * V, V);
    EXPECT_LT(RelErr(row, std::span<const float>(ref.data() + r * V, V)), 1e-6) << "row " << r;
    if (plan[r].mode == PickMode::kGreedy) {
      EXPECT_EQ(toks[r], Argmax(row)) << "row " << r;
    }
  }
  EXPECT_TRUE(std::isnan(got[static_cast<size_t>(V)])) << "row 1 kept nothing: not written";
  const std::vector<int32_t> past = {n};
  EXPECT_FALSE(b->ReadKeptLogits(past, got).ok());
  for (RowPick& p : plan) {
    p = RowPick{};
    p.mode = PickMode::kGreedy;
  }
  ASSERT_TRUE(b->ForwardSampled(steps, plan, toks, got).ok());
  EXPECT_FALSE(b->ReadKeptLogits(kept, got).ok()) << "the last step kept no logits";
}

// Sampled drafted rows as the engine plans them (PlanSampledDraft: each
// drafted row tests the token that follows it in the step): the GPU's
// picks are VerifyDraftRow's on the logits Forward gives for the same step
// (or ones a 1e-6 move of a uniform changes the CPU's verdict to), so the
// verdict read from them (VerifyGreedyDraft) is the CPU reference's; only
// the picks come back. Random draft tokens; the first sequence's are all
// accepted (u_accept 0, nothing truncated), the third's mostly rejected.
TEST(CudaBackend, SampledDraftRowsAreVerifiedOnTheGpu) {
  AGENTKV_REQUIRE_GPU();
  for (const bool wide : {false, true}) {
    DraftedRun d;
    ASSERT_NO_FATAL_FAILURE(StartDrafted(wide, 41, 9, &d));
    const int V = d.c.vocab_size, n = d.rows;
    std::uniform_real_distribution<double> un(0.0, 1.0);
    std::vector<RowPick> plan;
    for (size_t i = 0; i < d.seqs.size(); ++i) {
      const std::vector<int32_t>& t = d.seqs[i].tokens;
      const std::span<const int32_t> draft(t.data() + t.size() - d.drafts[i],
                                           static_cast<size_t>(d.drafts[i]));
      engine::PlanSampledDraft(
          draft,
          [&] {
            SampleSettings s;
            s.temperature = 0.7f;
            s.top_k = i == 0 ? 0 : 40;
            s.top_p = i == 0 ? 1.0f : 0.95f;
            s.u = un(d.rng);
            return s;
          },
          &plan);
    }
    // The first sequence: nothing truncated and u_accept 0, so each draft
    // token (any token of positive weight) is accepted.
    for (int r = 0; r < d.drafts[0]; ++r) plan[static_cast<size_t>(r)].u_accept = 0.0;
    ASSERT_EQ(plan.size(), static_cast<size_t>(n));
    std::vector<int32_t> toks(n, -1);
    std::vector<float> unused(static_cast<size_t>(n) * V, NAN);
    ASSERT_TRUE(d.b->ForwardSampled(d.steps, plan, toks, unused).ok());
    int accepted = 0;
    for (int r = 0; r < n; ++r) {
      const std::string what = "wide " + std::to_string(wide) + " row " + std::to_string(r);
      auto cpu = [&](const RowPick& p) {
        std::vector<float> buf(d.logits.begin() + static_cast<int64_t>(r) * V,
                               d.logits.begin() + static_cast<int64_t>(r + 1) * V);
        return PickDeviceRow(buf, p);
      };
      const int32_t want = cpu(plan[r]);
      accepted += plan[r].draft >= 0 && want == plan[r].draft;
      if (toks[r] == want) continue;
      bool near = false;
      for (double f : {1 - 1e-6, 1 + 1e-6}) {
        RowPick p = plan[r];
        p.u_accept *= f;
        near = near || cpu(p) != want;
        p = plan[r];
        p.sample.u *= f;
        near = near || cpu(p) != want;
      }
      EXPECT_TRUE(near) << what << ": gpu " << toks[r] << " cpu " << want;
    }
    // No logits were asked for: the rows' buffer is left as it was.
    EXPECT_TRUE(std::isnan(unused[0]));
    EXPECT_GE(accepted, d.drafts[0]) << "wide " << wide;
    std::printf("wide %d: %d of 7 draft tokens accepted\n", wide, accepted);
  }
}

// A step of more logits rows than the backend reserved (64, and more
// tokens than its workspaces held: both grow), every token of an
// 80-token chunk asking its row, matches the CPU; plain decode steps after
// it run as graphs again and still match.
TEST(CudaBackend, RowsBeyondTheReserveGrowTheWorkspaces) {
  AGENTKV_REQUIRE_GPU();
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const MapWeights w = Bf16Weights(c, 41);
  auto cpu = MakeCpu(c, w, 16);
  auto gpu = MakeCuda(c, w, 16);
  ASSERT_TRUE(gpu);
  auto run = [&](Backend& b) {
    std::mt19937 rng(9);
    Seq s;
    for (int j = 0; j < 90; ++j) s.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    Pager pager(b.cache_spec(), 16);
    pager.Ensure(s, 10);
    Rows out;
    std::vector<float> none;
    SeqStep head = StepOf(s, 10, false);
    EXPECT_TRUE(b.Forward({&head, 1}, none).ok());
    s.computed = 10;
    pager.Ensure(s, 90);
    SeqStep all = StepOf(s, 80, true);
    all.logit_rows = 80;
    std::vector<float> logits(80 * static_cast<size_t>(c.vocab_size), NAN);
    EXPECT_TRUE(b.Forward({&all, 1}, logits).ok());
    for (int r = 0; r < 80; ++r)
      out.emplace_back(logits.begin() + r * c.vocab_size, logits.begin() + (r + 1) * c.vocab_size);
    s.computed = 90;
    for (int k = 0; k < 4; ++k) {  // decode, teacher-forced
      s.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      pager.Ensure(s, s.computed + 1);
      SeqStep d = StepOf(s, 1, true);
      EXPECT_TRUE(b.Forward({&d, 1}, logits).ok());
      out.emplace_back(logits.begin(), logits.begin() + c.vocab_size);
      ++s.computed;
    }
    return out;
  };
  const Rows ref = run(*cpu);
  const Rows got = run(*gpu);
  ExpectRowsMatch(got, ref, "80 rows then decode");
  EXPECT_EQ(gpu->graph_steps(), 4);
}

// Pipelined: a drafted step, all rows greedy, then (before it is
// collected) a decode step, a graph, whose sequence takes its token from
// the drafted step's row by prev_row (row indices count every sequence's
// rows): the same picks as running both steps one by one with that token
// given.
TEST(CudaBackend, PrevRowNamesARowOfADraftedStep) {
  AGENTKV_REQUIRE_GPU();
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = Bf16Weights(c, 43);
  auto run = [&](bool pipelined) {
    auto b = MakeCuda(c, w, 16);
    EXPECT_TRUE(b);
    // Graphs captured up front: the decode step then launches while the
    // drafted step may still run, and its embedding reads the pick from
    // the device.
    EXPECT_TRUE(b->Reserve(64, 2).ok());
    std::mt19937 rng(12);
    std::vector<Seq> seqs = Prompts(c, 2, rng);
    // (Steps hold spans of the tokens: no reallocation below.)
    for (Seq& s : seqs) s.tokens.reserve(s.tokens.size() + 8);
    Pager pager(b->cache_spec(), 16);
    Prefill(*b, seqs, pager);
    // Sequence 0: its last token and a draft of 3 (rows 0..3); sequence 1:
    // its last token (row 4).
    for (int j = 0; j < 3; ++j)
      seqs[0].tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    for (Seq& s : seqs) pager.Ensure(s, static_cast<int64_t>(s.tokens.size()));
    std::vector<SeqStep> steps = {StepOf(seqs[0], 4, true), StepOf(seqs[1], 1, true)};
    steps[0].logit_rows = 4;
    std::vector<RowPick> plan(5);
    for (RowPick& p : plan) p.mode = PickMode::kGreedy;
    std::vector<float> logits(5 * static_cast<size_t>(c.vocab_size));
    std::vector<int32_t> first(5, -1), second(1, -1);
    seqs[1].computed += 1;
    seqs[1].tokens.push_back(0);  // the pick of row 4 goes here
    pager.Ensure(seqs[1], static_cast<int64_t>(seqs[1].tokens.size()));
    SeqStep next = StepOf(seqs[1], 1, true);
    std::vector<RowPick> one(1);
    one[0].mode = PickMode::kGreedy;
    if (pipelined) {
      EXPECT_TRUE(b->LaunchStep(steps, plan, logits).ok());
      next.prev_row = 4;
      EXPECT_TRUE(b->LaunchStep({&next, 1}, one, logits).ok());
      EXPECT_TRUE(b->CollectStep(first).ok());
      EXPECT_TRUE(b->CollectStep(second).ok());
    } else {
      EXPECT_TRUE(b->ForwardSampled(steps, plan, first, logits).ok());
      seqs[1].tokens.back() = first[4];
      next = StepOf(seqs[1], 1, true);
      EXPECT_TRUE(b->ForwardSampled({&next, 1}, one, second, logits).ok());
    }
    first.push_back(second[0]);
    return first;
  };
  const std::vector<int32_t> want = run(false);
  EXPECT_EQ(run(true), want);
  for (int32_t t : want) EXPECT_GE(t, 0);
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaBackendLogitRows, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
