// Speculative decoding's policy: eligibility, the step's draft budget and
// the adaptive draft length.
#include "engine/draft_policy.h"

#include <gtest/gtest.h>

namespace agentkv::engine {
namespace {

SpeculativeOptions On() {
  SpeculativeOptions o;
  o.mode = SpeculativeMode::kNgram;
  return o;
}

TEST(DraftPolicyTest, OnlyPlainRequestsThatDidNotOptOutAreDrafted) {
  SamplingParams p;
  EXPECT_TRUE(SpeculationEligible(On(), p));
  EXPECT_FALSE(SpeculationEligible(SpeculativeOptions{}, p));  // off
  SpeculativeOptions zero = On();
  zero.max_draft = 0;
  EXPECT_FALSE(SpeculationEligible(zero, p));
  p.temperature = 0;
  EXPECT_TRUE(SpeculationEligible(On(), p));
  SamplingParams out;
  out.speculative = false;  // per-request opt-out
  EXPECT_FALSE(SpeculationEligible(On(), out));
  SamplingParams lp;
  lp.logprobs = 2;
  EXPECT_FALSE(SpeculationEligible(On(), lp));
  SamplingParams pen;
  pen.repetition_penalty = 1.2f;
  EXPECT_FALSE(SpeculationEligible(On(), pen));
}

TEST(DraftPolicyTest, TheBudgetShrinksToNothingWhenTheStepIsComputeBound) {
  SpeculativeOptions o = On();
  o.compute_bound_tokens = 32;
  EXPECT_EQ(StepDraftBudget(o, 1, 0), 31);
  EXPECT_EQ(StepDraftBudget(o, 8, 0), 24);
  EXPECT_EQ(StepDraftBudget(o, 32, 0), 0);
  EXPECT_EQ(StepDraftBudget(o, 64, 0), 0);   // a full batch never drafts
  EXPECT_EQ(StepDraftBudget(o, 1, 100), 0);  // prefill in the step
  EXPECT_EQ(StepDraftBudget(o, 0, 0), 0);
  EXPECT_EQ(StepDraftBudget(SpeculativeOptions{}, 1, 0), 0);
}

TEST(DraftPolicyTest, TheLengthFollowsTheAcceptedRuns) {
  DraftLength d(8);
  EXPECT_EQ(d.Next(), 4);
  d.Update(4, 4);  // all accepted: doubles
  EXPECT_EQ(d.Next(), 8);
  d.Update(8, 8);
  EXPECT_EQ(d.Next(), 8);  // capped
  d.Update(8, 2);          // a run of two: next time three
  EXPECT_EQ(d.Next(), 3);
  d.Update(3, 0);
  EXPECT_EQ(d.Next(), 1);
  DraftLength small(2);
  EXPECT_EQ(small.Next(), 2);
  small.Update(2, 2);
  EXPECT_EQ(small.Next(), 2);
}

TEST(DraftPolicyTest, RepeatedMissesPauseDraftingThenItResumesShort) {
  DraftLength d(8);
  for (int i = 0; i < DraftLength::kMissesToPause; ++i) {
    const int k = d.Next();
    ASSERT_GT(k, 0) << i;
    d.Update(k, 0);
  }
  for (int i = 0; i < DraftLength::kPauseSteps; ++i) EXPECT_EQ(d.Next(), 0) << i;
  EXPECT_EQ(d.Next(), 1);
  // A hit in between resets the count of misses.
  DraftLength e(8);
  e.Update(4, 0);
  e.Update(1, 0);
  e.Update(1, 1);
  e.Update(2, 0);
  e.Update(1, 0);
  EXPECT_GT(e.Next(), 0);
}

}  // namespace
}  // namespace agentkv::engine
