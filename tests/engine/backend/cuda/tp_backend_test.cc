// TpBackend on 2 (and, where present, 4) GPUs against one GPU, on small
// random models of every architecture: teacher-forced logits within bf16
// noise of the single-GPU backend's (only the order of the all-reduced sums
// differs); greedy picks made on the GPUs (argmax keys, pipelined, graphs)
// equal to the argmax of the gathered logits; drawn rows (host mode) as
// step by step; KV blocks saved under one degree continue under another.
// Skips below 2 GPUs.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <cstdlib>

#include "../../step_driver.h"
#include "backend_test_util.h"
#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/tp_backend.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;

#define AGENTKV_REQUIRE_GPUS(n)                                                          \
  do {                                                                                   \
    AGENTKV_REQUIRE_GPU();                                                               \
    if (cuda::VisibleGpus() < (n))                                                       \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << cuda::VisibleGpus() << " visible"; \
  } while (0)

// SmallConfig with MLP and expert sizes that split over 2 and 4 ranks.
model::ModelConfig TpSmallConfig(model::Architecture arch) {
  model::ModelConfig c = SmallConfig(arch);
  c.intermediate_size = 64;
  if (c.IsMoe()) c.moe.expert_intermediate = 32;
  return c;
}

std::unique_ptr<TpBackend> MakeTp(const model::ModelConfig& c, const MapWeights& w, int bs,
                                  int degree, bool graphs = true) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // as main() does
  TpBackendOptions o;
  o.degree = degree;
  o.rank.tuning.graphs = graphs;
  o.rank.max_step_tokens = 64;
  o.rank.max_batch = 2;
  o.nccl.nvls_enable = "0";
  auto b = TpBackend::Create(c, w, o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return nullptr;
  AllocateTestKv(**b, bs);
  return std::move(b).value();
}

const model::Architecture kArchs[] = {model::Architecture::kLlama,   model::Architecture::kQwen2,
                                      model::Architecture::kQwen3,   model::Architecture::kMistral,
                                      model::Architecture::kGemma3,  model::Architecture::kGptOss,
                                      model::Architecture::kQwen3Moe};

TEST(TpBackend, LogitsAsOneGpuAndDevicePicksAsTheGatheredArgmax) {
  AGENTKV_REQUIRE_GPUS(2);
  for (int degree : {2, 4}) {
    if (cuda::VisibleGpus() < degree) continue;
    for (model::Architecture arch : kArchs) {
      const model::ModelConfig c = TpSmallConfig(arch);
      const MapWeights w = Bf16Weights(c, 21);
      auto one = MakeCuda(c, w, 4);
      auto tp = MakeTp(c, w, 4, degree);
      ASSERT_TRUE(one && tp);
      // What the KV records' fingerprint and layout see: as on one GPU.
      EXPECT_EQ(tp->kv_format(), one->kv_format());
      ASSERT_EQ(tp->cache_spec().groups.size(), one->cache_spec().groups.size());
      for (size_t g = 0; g < one->cache_spec().groups.size(); ++g)
        EXPECT_EQ(tp->cache_spec().BytesPerBlock(static_cast<int>(g), 4),
                  one->cache_spec().BytesPerBlock(static_cast<int>(g), 4));
      std::vector<int32_t> picks;
      const auto want = Drive(*one, 7, 10, 3, nullptr, &picks);
      const auto got = Drive(*tp, 7, 10, 3, &picks);  // teacher-forced
      ASSERT_EQ(want.size(), got.size());
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, RelErr(got[i], want[i]));
      EXPECT_LT(worst, 1e-2) << CaseName({arch, 7, 4}) << " degree " << degree;
      // Picks made on the GPUs (pipelined, graphs) equal the argmax of the
      // logits gathered to the host (every third step samples row 1).
      auto a = MakeTp(c, w, 4, degree);
      auto b = MakeTp(c, w, 4, degree, /*graphs=*/false);
      ASSERT_TRUE(a && b);
      EXPECT_EQ(GreedyPicks(*a, 16, /*pipelined=*/true, 9),
                GreedyPicks(*b, 16, /*pipelined=*/false, 9, /*sample_every=*/3))
          << CaseName({arch, 7, 4}) << " degree " << degree;
      EXPECT_GT(a->graphs_captured(), 0);
    }
  }
}

// Rows drawn with PickMode::kDevice run in host mode (the rows' logits
// gathered, SampleDraw on the host): pipelined, with the next step naming
// the drawn token, as step by step.
TEST(TpBackend, DrawnRowsPipelinedAsStepByStep) {
  AGENTKV_REQUIRE_GPUS(2);
  const model::ModelConfig c = TpSmallConfig(model::Architecture::kLlama);
  const MapWeights w = Bf16Weights(c, 17);
  auto a = MakeTp(c, w, 4, 2);
  auto b = MakeTp(c, w, 4, 2);
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> want = GreedyPicks(*a, 12, false, 9, 0, /*draw_row1=*/true);
  EXPECT_EQ(GreedyPicks(*b, 12, true, 9, 0, true), want);
  EXPECT_EQ(GreedyPicks(*b, 12, true, 9, 3, true).size(), want.size());
}

TEST(TpBackend, PrevRowMustNameAPickedRow) {
  AGENTKV_REQUIRE_GPUS(2);
  const model::ModelConfig c = TpSmallConfig(model::Architecture::kQwen3);
  const MapWeights w = Bf16Weights(c, 5);
  auto tp = MakeTp(c, w, 4, 2);
  ASSERT_TRUE(tp);
  Seq s;
  for (int j = 0; j < 6; ++j) s.tokens.push_back(j + 1);
  Pager pager(tp->cache_spec(), 4);
  pager.Ensure(s, 8);
  std::vector<float> logits(c.vocab_size);
  SeqStep st = StepOf(s, 6, true);
  const RowPick host;  // kHost
  ASSERT_TRUE(
      tp->LaunchStep(std::span<const SeqStep>(&st, 1), std::span<const RowPick>(&host, 1), logits)
          .ok());
  s.computed = 6;
  s.tokens.push_back(0);
  SeqStep next = StepOf(s, 1, true);
  next.prev_row = 0;
  auto r = tp->LaunchStep(std::span<const SeqStep>(&next, 1), std::span<const RowPick>(&host, 1),
                          logits);
  EXPECT_EQ(r.code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> picks(1);
  EXPECT_TRUE(tp->CollectStep(picks).ok());
}

// Blocks read from one degree and written into another: the single-GPU
// layout on both sides, so the next step's logits agree within the
// all-reduce's rounding, and a read after a write gives the same bytes.
TEST(TpBackend, BlocksMoveBetweenDegrees) {
  AGENTKV_REQUIRE_GPUS(2);
  for (model::Architecture arch : {model::Architecture::kLlama, model::Architecture::kGemma3}) {
    for (cache::KvDtype kv : {cache::KvDtype::kBF16, cache::KvDtype::kFP8E4M3}) {
      const model::ModelConfig c = TpSmallConfig(arch);
      const MapWeights w = Bf16Weights(c, 15);
      auto one = MakeCuda(c, w, 4, true, kv);
      auto fresh = MakeCuda(c, w, 4, true, kv);
      setenv("NCCL_NVLS_ENABLE", "0", 0);
      TpBackendOptions o;
      o.degree = 2;
      o.rank.kv_dtype = kv;
      o.rank.max_step_tokens = 64;
      o.rank.max_batch = 2;
      o.nccl.nvls_enable = "0";
      auto made = TpBackend::Create(c, w, o);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      auto tp = std::move(made).value();
      ASSERT_TRUE(AllocateTestKv(*tp, 4));
      ASSERT_TRUE(one && fresh);
      Seq s;
      for (int j = 0; j < 30; ++j) s.tokens.push_back((13 * j + 5) % c.vocab_size);
      Pager pager(tp->cache_spec(), 4);
      pager.Ensure(s, 31);
      std::vector<float> lt(c.vocab_size), lo(c.vocab_size), lf(c.vocab_size);
      SeqStep st = StepOf(s, 30, true);
      ASSERT_TRUE(tp->Forward(std::span<const SeqStep>(&st, 1), lt).ok());
      ASSERT_TRUE(one->Forward(std::span<const SeqStep>(&st, 1), lo).ok());
      // Saved under 2, restored under 1 (fresh), and back: 1 -> 2.
      for (size_t g = 0; g < tp->cache_spec().groups.size(); ++g) {
        const int gi = static_cast<int>(g);
        const size_t n = tp->cache_spec().BytesPerBlock(gi, 4) * s.tables[g].size();
        std::vector<std::byte> from_tp(n), from_one(n), again(n);
        ASSERT_TRUE(tp->ReadBlocks(gi, s.tables[g], from_tp).ok());
        ASSERT_TRUE(fresh->WriteBlocks(gi, s.tables[g], from_tp).ok());
        ASSERT_TRUE(one->ReadBlocks(gi, s.tables[g], from_one).ok());
        ASSERT_TRUE(tp->WriteBlocks(gi, s.tables[g], from_one).ok());
        ASSERT_TRUE(tp->ReadBlocks(gi, s.tables[g], again).ok());
        EXPECT_EQ(again, from_one);  // exact: split then merged
        // Asynchronous forms: the same bytes.
        std::vector<std::byte> async(n);
        auto t = tp->StartReadBlocks(gi, s.tables[g], async);
        ASSERT_TRUE(t.ok());
        ASSERT_TRUE(tp->ReadDone(*t, true).value());
        EXPECT_EQ(async, from_one);
      }
      s.tokens.push_back(3);
      s.computed = 30;
      SeqStep next = StepOf(s, 1, true);
      ASSERT_TRUE(one->Forward(std::span<const SeqStep>(&next, 1), lo).ok());
      ASSERT_TRUE(fresh->Forward(std::span<const SeqStep>(&next, 1), lf).ok());
      ASSERT_TRUE(tp->Forward(std::span<const SeqStep>(&next, 1), lt).ok());
      const double tol = kv == cache::KvDtype::kBF16 ? 1e-2 : 3e-2;
      EXPECT_LT(RelErr(lf, lo), tol) << "saved under 2, resumed under 1";
      EXPECT_LT(RelErr(lt, lo), tol) << "saved under 1, resumed under 2";
    }
  }
}

TEST(TpBackend, RefusesWithoutTheMulticastSetting) {
  AGENTKV_REQUIRE_GPUS(2);
  const model::ModelConfig c = TpSmallConfig(model::Architecture::kQwen3);
  const MapWeights w = Bf16Weights(c, 5);
  TpBackendOptions o;
  o.degree = 2;
  auto b = TpBackend::Create(c, w, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("NCCL_NVLS_ENABLE"), std::string::npos);
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else
TEST(TpBackend, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }
#endif
