// Backend's default pipelined steps (LaunchStep / CollectStep over
// ForwardSampled), on the CPU backend.
#include "engine/backend.h"

#include <gtest/gtest.h>

#include "engine/cpu_backend.h"
#include "step_driver.h"
#include "test_model.h"

namespace agentkv {
namespace {

using namespace agentkv::testing;

std::unique_ptr<CpuBackend> Make(const ModelConfig& c, const MapWeights& w) {
  auto b = CpuBackend::Create(c, w, CpuBackendOptions{2});
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  KvLayout layout;
  layout.block_size = 4;
  for (int g = 0; g < kMaxCacheGroups; ++g) layout.blocks_per_group[g] = 256;
  EXPECT_TRUE((*b)->AllocateKv(layout).ok());
  return std::move(b).value();
}

TEST(BackendTest, PipelinedStepsPickAsStepByStep) {
  for (Architecture arch : {Architecture::kQwen3, Architecture::kGemma3}) {
    const ModelConfig c = SmallConfig(arch);
    const MapWeights w = RandomWeights(c, 3);
    auto a = Make(c, w), b = Make(c, w);
    const std::vector<int32_t> want = GreedyPicks(*a, 12, /*pipelined=*/false, 5);
    EXPECT_EQ(GreedyPicks(*b, 12, /*pipelined=*/true, 5), want);
    EXPECT_EQ(want.size(), 3u + 3u * 12u);
    // Every third step samples a row: the pipeline drains around it.
    auto d = Make(c, w);
    EXPECT_EQ(GreedyPicks(*d, 12, /*pipelined=*/true, 5, /*sample_every=*/3), want);
  }
}

TEST(BackendTest, PipelinedStepsRejectMisuse) {
  const ModelConfig c = SmallConfig(Architecture::kLlama);
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

}  // namespace
}  // namespace agentkv
