// ChoosePickMode: which sampling parameters let the backend pick a row.
#include "engine/pick_mode.h"

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(ChoosePickModeTest, OnlyPlainParamsArePickedByTheBackend) {
  SamplingParams p;
  EXPECT_EQ(ChoosePickMode(p), PickMode::kDevice);  // temperature 1, the APIs' default
  EXPECT_TRUE(DeviceSamplable(p));
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 3;
  p.temperature = 0.7f;
  EXPECT_EQ(ChoosePickMode(p), PickMode::kDevice);
  p.temperature = 0;
  EXPECT_EQ(ChoosePickMode(p), PickMode::kGreedy);
  EXPECT_FALSE(DeviceSamplable(p));
  for (int which = 0; which < 4; ++which) {
    SamplingParams q;
    q.temperature = which % 2 ? 0.0f : 1.0f;
    if (which < 2) q.repetition_penalty = 1.1f;
    if (which == 2) q.presence_penalty = 0.5f;
    if (which == 3) q.frequency_penalty = -0.5f;
    EXPECT_EQ(ChoosePickMode(q), PickMode::kHost) << which;
  }
  SamplingParams lp;
  lp.logprobs = 0;  // even the sampled token's logprob needs the whole row
  EXPECT_EQ(ChoosePickMode(lp), PickMode::kHost);
  lp.temperature = 0;
  EXPECT_EQ(ChoosePickMode(lp), PickMode::kHost);
}

}  // namespace
}  // namespace agentkv
