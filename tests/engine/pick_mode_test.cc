// ChoosePickMode: which sampling parameters let the backend pick a row.
#include "engine/pick_mode.h"

#include <gtest/gtest.h>

namespace agentkv::engine {
namespace {

TEST(ChoosePickModeTest, OnlyPlainParamsArePickedByTheBackend) {
  SamplingParams p;
  EXPECT_EQ(ChoosePickMode(p), backend::PickMode::kDevice);  // temperature 1, the APIs' default
  EXPECT_TRUE(DeviceSamplable(p));
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 3;
  p.temperature = 0.7f;
  EXPECT_EQ(ChoosePickMode(p), backend::PickMode::kDevice);
  p.temperature = 0;
  EXPECT_EQ(ChoosePickMode(p), backend::PickMode::kGreedy);
  EXPECT_FALSE(DeviceSamplable(p));
  for (int which = 0; which < 4; ++which) {
    SamplingParams q;
    q.temperature = which % 2 ? 0.0f : 1.0f;
    if (which < 2) q.repetition_penalty = 1.1f;
    if (which == 2) q.presence_penalty = 0.5f;
    if (which == 3) q.frequency_penalty = -0.5f;
    EXPECT_EQ(ChoosePickMode(q), backend::PickMode::kHost) << which;
  }
  SamplingParams lp;
  lp.logprobs = 0;  // even the sampled token's logprob needs the whole row
  EXPECT_EQ(ChoosePickMode(lp), backend::PickMode::kHost);
  lp.temperature = 0;
  EXPECT_EQ(ChoosePickMode(lp), backend::PickMode::kHost);
}

// A backend that computes logprobs next to its picks (RowLogprobs) takes
// rows asking for them, unless penalties need the whole row on the host;
// the plan carries how many top entries the row asked for.
TEST(ChoosePickModeTest, DeviceLogprobsKeepLogprobRowsOnTheBackend) {
  SamplingParams lp;
  lp.logprobs = 5;
  EXPECT_EQ(ChoosePickMode(lp, /*device_logprobs=*/true), backend::PickMode::kDevice);
  backend::RowPick r = PlanRowPick(lp, true);
  EXPECT_EQ(r.mode, backend::PickMode::kDevice);
  EXPECT_EQ(r.logprobs, 5);
  lp.temperature = 0;
  r = PlanRowPick(lp, true);
  EXPECT_EQ(r.mode, backend::PickMode::kGreedy);
  EXPECT_EQ(r.logprobs, 5);
  lp.logprobs = SamplingParams::kMaxLogprobs;
  EXPECT_EQ(PlanRowPick(lp, true).logprobs, SamplingParams::kMaxLogprobs);
  lp.logprobs = 0;
  EXPECT_EQ(PlanRowPick(lp, true).logprobs, 0);
  // Without the backend's logprobs: the host, as before.
  r = PlanRowPick(lp, false);
  EXPECT_EQ(r.mode, backend::PickMode::kHost);
  EXPECT_EQ(r.logprobs, -1);
  // Penalties: the host either way.
  lp.frequency_penalty = 0.5f;
  EXPECT_EQ(ChoosePickMode(lp, true), backend::PickMode::kHost);
  EXPECT_EQ(PlanRowPick(lp, true).logprobs, -1);
  // No logprobs asked: none planned.
  SamplingParams plain;
  r = PlanRowPick(plain, true);
  EXPECT_EQ(r.mode, backend::PickMode::kDevice);
  EXPECT_EQ(r.logprobs, -1);
}

// Optimistic picks of constrained rows: never off, never without kept
// logits rows; on a device by default, and on the host only when asked.
TEST(UseOptimisticGrammarTest, AutoMeansWhereTheBackendPicksOnADevice) {
  for (bool kept : {false, true}) {
    for (bool device : {false, true}) {
      EXPECT_FALSE(UseOptimisticGrammar(OptimisticGrammar::kOff, kept, device));
      EXPECT_EQ(UseOptimisticGrammar(OptimisticGrammar::kOn, kept, device), kept);
      EXPECT_EQ(UseOptimisticGrammar(OptimisticGrammar::kAuto, kept, device), kept && device);
    }
  }
}

// Which rows let the next step launch before their step is collected:
// backend picks; kept (optimistic grammar) rows only where the backend
// keeps their logits while the next step runs; host picks never.
TEST(RowPipelinesTest, KeptRowsPipelineOnlyWhereReadableInFlight) {
  for (bool in_flight : {false, true}) {
    for (backend::PickMode mode : {backend::PickMode::kGreedy, backend::PickMode::kDevice}) {
      backend::RowPick r;
      r.mode = mode;
      EXPECT_TRUE(RowPipelines(r, in_flight));
      r.keep_logits = 1;
      EXPECT_EQ(RowPipelines(r, in_flight), in_flight);
    }
    backend::RowPick host;
    host.mode = backend::PickMode::kHost;
    EXPECT_FALSE(RowPipelines(host, in_flight));
  }
}

}  // namespace
}  // namespace agentkv::engine
