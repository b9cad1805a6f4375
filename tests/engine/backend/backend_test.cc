// Backend's default pipelined steps (LaunchStep / CollectStep over
// ForwardSampled), on the CPU backend.
#include "engine/backend/backend.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "../step_driver.h"
#include "../test_model.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/row_logprobs.h"
#include "engine/backend/sample_draw.h"

namespace agentkv::backend {
namespace {

using namespace agentkv::testing;

std::unique_ptr<cpu::CpuBackend> Make(const model::ModelConfig& c, const MapWeights& w) {
  auto b = cpu::CpuBackend::Create(c, w, cpu::CpuBackendOptions{2});
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  KvLayout layout;
  layout.block_size = 4;
  for (int g = 0; g < kMaxCacheGroups; ++g) layout.blocks_per_group[g] = 256;
  EXPECT_TRUE((*b)->AllocateKv(layout).ok());
  return std::move(b).value();
}

TEST(BackendTest, PipelinedStepsPickAsStepByStep) {
  for (model::Architecture arch : {model::Architecture::kQwen3, model::Architecture::kGemma3}) {
    const model::ModelConfig c = SmallConfig(arch);
    const MapWeights w = RandomWeights(c, 3);
    auto a = Make(c, w), b = Make(c, w);
    const std::vector<int32_t> want = GreedyPicks(*a, 12, /*pipelined=*/false, 5);
    EXPECT_EQ(GreedyPicks(*b, 12, /*pipelined=*/true, 5), want);
    EXPECT_EQ(want.size(), 3u + 3u * 12u);
    // Every third step samples a row: the pipeline drains around it.
    auto d = Make(c, w);
    EXPECT_EQ(GreedyPicks(*d, 12, /*pipelined=*/true, 5, /*sample_every=*/3), want);
    // Row 1 drawn by the backend: the next step reads its pick (prev_row).
    auto e = Make(c, w), f = Make(c, w);
    const std::vector<int32_t> drawn = GreedyPicks(*e, 12, false, 5, 0, /*draw_row1=*/true);
    EXPECT_EQ(GreedyPicks(*f, 12, true, 5, 0, true), drawn);
    EXPECT_NE(drawn, want);
  }
}

// Decode steps whose rows ask for logprobs pipeline as plain ones (the next
// step launched before the last is collected): the picks of a run without
// logprobs, and each collected step brings the logprobs a step-by-step run
// gives for it; greedy rows and a drawn one.
TEST(BackendTest, PipelinedStepsWithLogprobsPickAsStepByStep) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const MapWeights w = RandomWeights(c, 7);
  for (bool draw : {false, true}) {
    auto a = Make(c, w), b = Make(c, w), d = Make(c, w);
    const std::vector<int32_t> plain = GreedyPicks(*a, 10, /*pipelined=*/false, 5, 0, draw);
    std::vector<RowLogprobs> want, got;
    EXPECT_EQ(GreedyPicks(*b, 10, false, 5, 0, draw, &want), plain) << "draw " << draw;
    EXPECT_EQ(GreedyPicks(*d, 10, true, 5, 0, draw, &got), plain) << "draw " << draw;
    ASSERT_EQ(want.size(), 30u);
    ExpectSameLogprobs(want, got, 0.0f);
    const size_t first = plain.size() - 30;  // the decode steps' picks
    for (size_t r = 0; r < want.size(); ++r) {
      EXPECT_EQ(want[r].count, r % 3 == 0 ? 5 : r % 3 == 1 ? 3 : 20) << "row " << r;
      if (!(draw && r % 3 == 1)) {
        EXPECT_EQ(want[r].ids[0], plain[first + r]) << "greedy row " << r;
      }
    }
  }
}

TEST(BackendTest, PipelinedStepsRejectMisuse) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  auto b = Make(c, RandomWeights(c, 4));
  std::vector<float> logits(2 * c.vocab_size);
  std::vector<int32_t> picks(2);
  EXPECT_EQ(b->CollectStep(picks).code(), StatusCode::kInternal);  // nothing launched
  std::vector<int32_t> toks = {5, 6, 7}, table = {0};
  SeqStep st;
  st.tokens = toks;
  st.block_tables[0] = table;
  st.want_logits = true;
  const std::vector<uint8_t> greedy = {1};
  st.prev_row = 0;  // no step before it
  EXPECT_EQ(b->LaunchStep({&st, 1}, greedy, logits).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Forward({&st, 1}, logits).code(), StatusCode::kInvalidArgument);
  st.prev_row = -1;
  ASSERT_TRUE(b->LaunchStep({&st, 1}, greedy, logits).ok());
  ASSERT_TRUE(b->LaunchStep({&st, 1}, greedy, logits).ok());
  EXPECT_EQ(b->LaunchStep({&st, 1}, greedy, logits).code(), StatusCode::kInternal);  // a third
  std::vector<int32_t> none;  // too small: refused, the step stays in flight
  EXPECT_EQ(b->CollectStep(none).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->steps_in_flight(), 2);
  EXPECT_EQ(b->steps_in_flight(), 2);
  st.prev_row = 1;  // the previous step has one row
  ASSERT_TRUE(b->CollectStep(picks).ok());
  EXPECT_EQ(b->LaunchStep({&st, 1}, greedy, logits).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->CollectStep(picks).ok());
  EXPECT_EQ(b->steps_in_flight(), 0);
}

// Several logits rows per sequence are for backends that say so; others
// refuse them as Unimplemented (the engine then never drafts), and prev_row
// never combines with them.
TEST(BackendTest, CheckStepsGatesSeveralLogitRows) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const cache::ModelCacheSpec spec = c.CacheSpec(cache::KvDtype::kF32);
  KvLayout layout;
  layout.block_size = 4;
  for (int g = 0; g < kMaxCacheGroups; ++g) layout.blocks_per_group[g] = 8;
  std::vector<int32_t> toks = {5, 6, 7}, table = {0};
  SeqStep st;
  st.tokens = toks;
  st.block_tables[0] = table;
  st.want_logits = true;
  st.logit_rows = 3;
  EXPECT_EQ(CheckSteps({&st, 1}, c, spec, layout).code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(CheckSteps({&st, 1}, c, spec, layout, false, true).ok());
  EXPECT_EQ(LogitRows(st), 3);
  st.prev_row = 0;
  EXPECT_EQ(CheckSteps({&st, 1}, c, spec, layout, true, true).code(), StatusCode::kInvalidArgument);
  st.prev_row = -1;
  st.logit_rows = 4;
  EXPECT_EQ(CheckSteps({&st, 1}, c, spec, layout, false, true).code(),
            StatusCode::kInvalidArgument);
  st.want_logits = false;
  st.logit_rows = 1;
  EXPECT_EQ(LogitRows(st), 0);
}

// One step with a greedy, a drawn and a host row: the default
// ForwardSampled picks the first two with the CPU references on Forward's
// logits and leaves the host row's logits as Forward gives them; through
// LaunchStep / CollectStep the same.
TEST(BackendTest, ForwardSampledPicksEachRowAsPlanned) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = RandomWeights(c, 6);
  auto ref = Make(c, w), b = Make(c, w), p = Make(c, w);
  const int64_t V = c.vocab_size;
  std::vector<std::vector<int32_t>> toks = {{5, 6, 7}, {9, 10}, {11, 12, 13, 14}};
  std::vector<std::vector<int32_t>> tables = {{0}, {1}, {2}};
  std::vector<SeqStep> steps(3);
  for (int s = 0; s < 3; ++s) {
    steps[s].tokens = toks[s];
    steps[s].block_tables[0] = tables[s];
    steps[s].want_logits = true;
  }
  std::vector<float> logits(3 * V);
  ASSERT_TRUE(ref->Forward(steps, logits).ok());
  std::vector<RowPick> rows(3);
  rows[0].mode = PickMode::kGreedy;
  rows[1].mode = PickMode::kDevice;
  rows[1].sample.temperature = 1.5f;
  rows[1].sample.top_k = 30;
  rows[1].sample.top_p = 0.95f;
  rows[1].sample.u = 0.61;
  rows[2].mode = PickMode::kHost;
  const std::vector<float> row0(logits.begin(), logits.begin() + V);
  std::vector<float> row1(logits.begin() + V, logits.begin() + 2 * V);
  const std::vector<float> row2(logits.begin() + 2 * V, logits.end());
  const int32_t greedy =
      static_cast<int32_t>(std::max_element(row0.begin(), row0.end()) - row0.begin());
  const int32_t drawn = SampleDraw(row1, rows[1].sample);

  std::vector<float> got(3 * V, -1.0f);
  std::vector<int32_t> picks(3, -1);
  ASSERT_TRUE(b->ForwardSampled(steps, rows, picks, got).ok());
  EXPECT_EQ(picks[0], greedy);
  EXPECT_EQ(picks[1], drawn);
  EXPECT_EQ(std::vector<float>(got.begin() + 2 * V, got.end()), row2);

  std::vector<float> got2(3 * V, -1.0f);
  std::vector<int32_t> picks2(3, -1);
  ASSERT_TRUE(p->LaunchStep(steps, rows, got2).ok());
  ASSERT_TRUE(p->CollectStep(picks2).ok());
  EXPECT_EQ(picks2[0], greedy);
  EXPECT_EQ(picks2[1], drawn);
  EXPECT_EQ(std::vector<float>(got2.begin() + 2 * V, got2.end()), row2);
}

// Kept rows on the default LaunchStep (the CPU backend): once the step is
// collected, ReadKeptLogits finds every kept row in place, a drawn one
// unclobbered by its draw, with the same picks; refused while the step is
// in flight, for a row out of range, for a buffer too small, and after a
// Forward; a backend without kept rows says Unimplemented.
TEST(BackendTest, KeptRowsStayReadableAfterTheStep) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = RandomWeights(c, 6);
  auto ref = Make(c, w), b = Make(c, w);
  EXPECT_TRUE(b->reads_kept_logits());
  EXPECT_FALSE(b->picks_on_device());
  const int64_t V = c.vocab_size;
  std::vector<std::vector<int32_t>> toks = {{5, 6, 7}, {9, 10}};
  std::vector<std::vector<int32_t>> tables = {{0}, {1}};
  std::vector<SeqStep> steps(2);
  for (int s = 0; s < 2; ++s) {
    steps[s].tokens = toks[s];
    steps[s].block_tables[0] = tables[s];
    steps[s].want_logits = true;
  }
  std::vector<float> logits(2 * V);
  ASSERT_TRUE(ref->Forward(steps, logits).ok());
  std::vector<RowPick> rows(2);
  rows[0].mode = PickMode::kGreedy;
  rows[0].keep_logits = 1;
  rows[1].mode = PickMode::kDevice;
  rows[1].keep_logits = 1;
  rows[1].sample.temperature = 1.0f;
  rows[1].sample.u = 0.37;
  std::vector<float> row1(logits.begin() + V, logits.end());
  const int32_t drawn = SampleDraw(row1, rows[1].sample);
  std::vector<float> got(2 * V, -1.0f);
  std::vector<int32_t> picks(2, -1);
  const std::vector<int32_t> kept = {0, 1};
  ASSERT_TRUE(b->LaunchStep(steps, rows, got).ok());
  EXPECT_EQ(b->ReadKeptLogits(kept, got).code(), StatusCode::kInternal);  // in flight
  ASSERT_TRUE(b->CollectStep(picks).ok());
  ASSERT_TRUE(b->ReadKeptLogits(kept, got).ok());
  EXPECT_EQ(got, logits);
  EXPECT_EQ(picks[1], drawn);
  const std::vector<int32_t> past = {2};
  EXPECT_EQ(b->ReadKeptLogits(past, got).code(), StatusCode::kInvalidArgument);
  std::vector<float> small(V);
  EXPECT_EQ(b->ReadKeptLogits(kept, small).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->Forward(steps, got).ok());
  EXPECT_EQ(b->ReadKeptLogits(kept, got).code(), StatusCode::kInternal);
  EXPECT_EQ(b->Backend::ReadKeptLogits(kept, got).code(), StatusCode::kUnimplemented);
}

// Kept rows while the next step is in flight (pipelined constrained
// steps): on the default LaunchStep, the kept rows of the step collected
// last stay readable while one later step runs, if that step's logits went
// to another span; refused when it reused the span, when the wrong span is
// named, and when two steps were launched after it.
TEST(BackendTest, KeptRowsStayReadableWhileTheNextStepRuns) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = RandomWeights(c, 6);
  auto ref = Make(c, w), b = Make(c, w);
  EXPECT_TRUE(b->reads_kept_logits_in_flight());
  const int64_t V = c.vocab_size;
  std::vector<int32_t> toks = {5, 6, 7};
  std::vector<int32_t> table = {0};
  SeqStep step;
  step.tokens = toks;
  step.block_tables[0] = table;
  step.want_logits = true;
  std::vector<float> expect(V);
  ASSERT_TRUE(ref->Forward(std::span<const SeqStep>(&step, 1), expect).ok());
  std::vector<RowPick> rows(1);
  rows[0].mode = PickMode::kGreedy;
  rows[0].keep_logits = 1;
  std::vector<float> a(V, -1.0f), other(V, -1.0f);
  std::vector<int32_t> picks(1, -1);
  const std::vector<int32_t> kept = {0};
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&step, 1), rows, a).ok());
  // The next step (a decode of the pick, in another span) launches first.
  std::vector<int32_t> next_toks = {0};
  SeqStep next = step;
  next.tokens = next_toks;
  next.start_pos = 3;
  next.prev_row = 0;
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&next, 1), rows, other).ok());
  ASSERT_TRUE(b->CollectStep(picks).ok());
  ASSERT_TRUE(b->ReadKeptLogits(kept, a).ok());
  EXPECT_EQ(a, expect);
  EXPECT_EQ(b->ReadKeptLogits(kept, other).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(b->CollectStep(picks).ok());
  ASSERT_TRUE(b->ReadKeptLogits(kept, other).ok());
  // The next step reusing the collected step's span: refused.
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&step, 1), rows, a).ok());
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&step, 1), rows, a).ok());
  ASSERT_TRUE(b->CollectStep(picks).ok());
  EXPECT_EQ(b->ReadKeptLogits(kept, a).code(), StatusCode::kInternal);
  ASSERT_TRUE(b->CollectStep(picks).ok());
  // Two steps launched after the collected one: refused.
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&step, 1), rows, a).ok());
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&step, 1), rows, other).ok());
  ASSERT_TRUE(b->CollectStep(picks).ok());
  ASSERT_TRUE(b->LaunchStep(std::span<const SeqStep>(&step, 1), rows, a).ok());
  EXPECT_EQ(b->ReadKeptLogits(kept, a).code(), StatusCode::kInternal);
}

// Rows asking for logprobs: the default ForwardSampled gives ComputeRowLogprobs
// of Forward's logits (scale 1 / temperature for the drawn row, 1 for the
// greedy one) with the pick as the chosen token, and the same picks as
// without logprobs; through LaunchStep / CollectStep the same per step.
TEST(BackendTest, PicksComeWithTheirLogprobs) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = RandomWeights(c, 6);
  auto ref = Make(c, w), b = Make(c, w), p = Make(c, w);
  EXPECT_TRUE(b->picks_logprobs());
  const int64_t V = c.vocab_size;
  std::vector<std::vector<int32_t>> toks = {{5, 6, 7}, {9, 10}, {11, 12, 13, 14}};
  std::vector<std::vector<int32_t>> tables = {{0}, {1}, {2}};
  std::vector<SeqStep> steps(3);
  for (int s = 0; s < 3; ++s) {
    steps[s].tokens = toks[s];
    steps[s].block_tables[0] = tables[s];
    steps[s].want_logits = true;
  }
  std::vector<float> logits(3 * V);
  ASSERT_TRUE(ref->Forward(steps, logits).ok());
  std::vector<RowPick> rows(3);
  rows[0].mode = PickMode::kGreedy;
  rows[0].logprobs = 3;
  rows[1].mode = PickMode::kDevice;
  rows[1].sample.temperature = 0.5f;
  rows[1].sample.u = 0.3;
  rows[1].logprobs = 0;
  rows[2].mode = PickMode::kDevice;  // no logprobs asked
  rows[2].sample.u = 0.8;
  std::vector<float> row1(logits.begin() + V, logits.begin() + 2 * V);
  const int32_t drawn = SampleDraw(row1, rows[1].sample);

  auto check = [&](std::span<const int32_t> picks, std::span<const RowLogprobs> lps) {
    ASSERT_EQ(lps.size(), 3u);
    EXPECT_EQ(picks[1], drawn);
    const RowLogprobs g =
        ComputeRowLogprobs(logits.data(), static_cast<int32_t>(V), 1.0, 3, picks[0]);
    EXPECT_EQ(lps[0].count, 3);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(lps[0].ids[k], g.ids[k]);
      EXPECT_FLOAT_EQ(lps[0].logprobs[k], g.logprobs[k]);
    }
    EXPECT_EQ(lps[0].ids[0], picks[0]);  // greedy: the most likely
    EXPECT_FLOAT_EQ(lps[0].chosen, g.chosen);
    const RowLogprobs d =
        ComputeRowLogprobs(logits.data() + V, static_cast<int32_t>(V), 2.0, 0, drawn);
    EXPECT_EQ(lps[1].count, 0);
    EXPECT_FLOAT_EQ(lps[1].chosen, d.chosen);
    EXPECT_EQ(lps[2].count, -1);
  };
  std::vector<float> got(3 * V);
  std::vector<int32_t> picks(3, -1);
  ASSERT_TRUE(b->ForwardSampled(steps, rows, picks, got).ok());
  check(picks, b->collected_logprobs());
  // Pipelined: each collected step brings its own.
  std::vector<RowPick> plain = rows;
  for (RowPick& r : plain) r.logprobs = -1;
  std::vector<float> got2(3 * V);
  ASSERT_TRUE(p->LaunchStep(steps, rows, got2).ok());
  std::vector<SeqStep> again = steps;
  std::vector<std::vector<int32_t>> tables2 = {{3}, {4}, {5}};
  for (int s = 0; s < 3; ++s) again[s].block_tables[0] = tables2[s];
  std::vector<float> got3(3 * V);
  ASSERT_TRUE(p->LaunchStep(again, plain, got3).ok());
  std::vector<int32_t> picks2(3, -1);
  ASSERT_TRUE(p->CollectStep(picks2).ok());
  check(picks2, p->collected_logprobs());
  ASSERT_TRUE(p->CollectStep(picks2).ok());
  for (const RowLogprobs& lp : p->collected_logprobs()) EXPECT_EQ(lp.count, -1);
}

// A backend without asynchronous copies writes in StartWriteBlocks itself:
// its tickets are done at once, and errors start nothing.
TEST(BackendTest, StartWriteBlocksWritesAtOnceByDefault) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  auto b = Make(c, RandomWeights(c, 3));
  const size_t n = b->cache_spec().BytesPerBlock(0, 4);
  std::vector<std::byte> in(2 * n);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::byte>(i * 7 + 1);
  const std::vector<int32_t> ids = {9, 4};
  auto t = b->StartWriteBlocks(0, ids, in);
  ASSERT_TRUE(t.ok());
  std::fill(in.begin(), in.end(), std::byte{0});  // the source is free at once
  auto done = b->WriteDone(*t, false);
  ASSERT_TRUE(done.ok() && *done);
  std::vector<std::byte> out(n);
  ASSERT_TRUE(b->ReadBlock(0, 4, out).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<std::byte>((n + i) * 7 + 1));
  EXPECT_FALSE(b->StartWriteBlocks(0, ids, std::span<const std::byte>(in).first(n)).ok());
}

}  // namespace
}  // namespace agentkv::backend
