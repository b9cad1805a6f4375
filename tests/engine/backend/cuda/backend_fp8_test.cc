// CudaBackend with an fp8 (e4m3) KV cache against CpuBackend with the same
// cache format, on the small random models of backend_test.cc (same
// helpers, backend_test_util.h). Tolerances: at most 0.3 relative L2 error
// on any logits row and 0.1 on average (e4m3 keys and values round far more
// than bf16), the same argmax where the CPU's top-two gap exceeds 0.5 x the
// logits' RMS. Also restored blocks, graphs and pipelined steps, and
// misaligned blocks refused.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "backend_test_util.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/backend.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;

class CudaFp8VsCpuFp8 : public ::testing::TestWithParam<ArchCase> {};

// The CUDA backend under `tuning` against the CPU's, both with fp8 caches.
void ExpectLogitsMatch(const ArchCase& ac, const CudaTuning& tuning) {
  model::ModelConfig c = ac.wide ? WideConfig(ac.arch) : SmallConfig(ac.arch);
  const MapWeights w = Bf16Weights(c, 11);
  auto cpu = MakeCpu(c, w, ac.block_size, cache::KvDtype::kFP8E4M3);
  auto gpu = MakeCuda(c, w, ac.block_size, tuning, cache::KvDtype::kFP8E4M3);
  ASSERT_TRUE(gpu);
  EXPECT_EQ(gpu->kv_format(), "fp8_e4m3");
  EXPECT_EQ(gpu->kv_element_size(), 1u);
  EXPECT_EQ(gpu->cache_spec().BytesPerBlock(0, ac.block_size),
            cpu->cache_spec().BytesPerBlock(0, ac.block_size));
  std::vector<int32_t> cpu_picks;
  const auto ref = Drive(*cpu, ac.chunk, 12, 5, nullptr, &cpu_picks);
  const auto got = Drive(*gpu, ac.chunk, 12, 5, &cpu_picks);
  ASSERT_EQ(ref.size(), got.size());
  double worst = 0, sum = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = RelErr(got[i], ref[i]);
    worst = std::max(worst, e);
    sum += e;
    EXPECT_LT(e, 0.3) << "row " << i;
    std::vector<float> sorted = ref[i];
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double ms = 0;
    for (float x : ref[i]) ms += static_cast<double>(x) * x;
    if (sorted[0] - sorted[1] > 0.5 * std::sqrt(ms / ref[i].size())) {
      EXPECT_EQ(std::max_element(got[i].begin(), got[i].end()) - got[i].begin(),
                std::max_element(ref[i].begin(), ref[i].end()) - ref[i].begin())
          << "row " << i;
    }
  }
  EXPECT_LT(sum / ref.size(), 0.1) << "mean logits error";
  std::printf("fp8: worst logits rel err %.2e, mean %.2e\n", worst, sum / ref.size());
  EXPECT_GT(gpu->graph_steps(), 0);
}

TEST_P(CudaFp8VsCpuFp8, LogitsMatch) {
  AGENTKV_REQUIRE_GPU();
  ExpectLogitsMatch(GetParam(), CudaTuning{});
}

// The lean fp8 decode form (CudaTuning::fp8_decode_lean, the default: the
// cases above run it too), named explicitly at head_dim 64: its graphs'
// decode steps of one or two sequences take up to 64 splits (most of them
// empty at these contexts), merged by the combine's wider form.
TEST(CudaFp8VsCpuFp8Lean, LogitsMatch) {
  AGENTKV_REQUIRE_GPU();
  CudaTuning t;
  t.fp8_decode_lean = true;
  ExpectLogitsMatch(ArchCase{model::Architecture::kQwen3, 16, 16, true}, t);
  ExpectLogitsMatch(ArchCase{model::Architecture::kQwen3, 7, 4, true}, t);
}

// The old fp8 decode form (AGENTKV_CUDA_FP8_DECODE_LEAN=0, kept for
// comparison): at most 32 splits, four staging stages at either head_dim.
TEST(CudaFp8VsCpuFp8OldForm, LogitsMatch) {
  AGENTKV_REQUIRE_GPU();
  CudaTuning t;
  t.fp8_decode_lean = false;
  ExpectLogitsMatch(ArchCase{model::Architecture::kQwen3, 16, 16, true}, t);
  ExpectLogitsMatch(ArchCase{model::Architecture::kLlama, 16, 16}, t);
  ExpectLogitsMatch(ArchCase{model::Architecture::kGemma3, 6, 4}, t);
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaFp8VsCpuFp8,
                         ::testing::Values(ArchCase{model::Architecture::kLlama, 16, 16},
                                           ArchCase{model::Architecture::kQwen2, 7, 4},
                                           ArchCase{model::Architecture::kGemma3, 6, 4},
                                           ArchCase{model::Architecture::kGemma3, 64, 2},
                                           ArchCase{model::Architecture::kQwen3, 16, 16, true},
                                           ArchCase{model::Architecture::kGptOss, 7, 4}),
                         [](const auto& info) { return CaseName(info.param); });

// fp8 blocks saved (ReadBlock) and restored (WriteBlock) continue exactly as
// computed in place; the CPU's fp8 blocks (the same layout) continue on the
// GPU within the tolerance above.
TEST(CudaBackend, Fp8RestoredBlocksContinueTheSame) {
  AGENTKV_REQUIRE_GPU();
  model::ModelConfig c = SmallConfig(model::Architecture::kLlama);
  const MapWeights w = Bf16Weights(c, 15);
  auto a = MakeCuda(c, w, 16, true, cache::KvDtype::kFP8E4M3);
  auto b = MakeCuda(c, w, 16, true, cache::KvDtype::kFP8E4M3);
  auto cpu = MakeCpu(c, w, 16, cache::KvDtype::kFP8E4M3);
  ASSERT_TRUE(a && b);
  Seq s;
  for (int j = 0; j < 40; ++j) s.tokens.push_back((13 * j + 5) % c.vocab_size);
  Pager pager(a->cache_spec(), 16);
  pager.Ensure(s, 41);
  std::vector<float> la(c.vocab_size), lb(c.vocab_size), lc(c.vocab_size);
  SeqStep st = StepOf(s, 40, true);
  ASSERT_TRUE(a->Forward(std::span<const SeqStep>(&st, 1), la).ok());
  ASSERT_TRUE(cpu->Forward(std::span<const SeqStep>(&st, 1), lc).ok());
  const size_t n = a->cache_spec().BytesPerBlock(0, 16);
  std::vector<std::byte> buf(n);
  for (int32_t blk : s.tables[0]) {
    ASSERT_TRUE(a->ReadBlock(0, blk, buf).ok());
    ASSERT_TRUE(b->WriteBlock(0, blk, buf).ok());
  }
  s.tokens.push_back(3);
  s.computed = 40;
  SeqStep next = StepOf(s, 1, true);
  ASSERT_TRUE(a->Forward(std::span<const SeqStep>(&next, 1), la).ok());
  ASSERT_TRUE(b->Forward(std::span<const SeqStep>(&next, 1), lb).ok());
  EXPECT_EQ(la, lb);
  // The CPU's blocks on a fresh GPU backend.
  auto d = MakeCuda(c, w, 16, true, cache::KvDtype::kFP8E4M3);
  ASSERT_TRUE(d);
  for (int32_t blk : s.tables[0]) {
    ASSERT_TRUE(cpu->ReadBlock(0, blk, buf).ok());
    ASSERT_TRUE(d->WriteBlock(0, blk, buf).ok());
  }
  ASSERT_TRUE(cpu->Forward(std::span<const SeqStep>(&next, 1), lc).ok());
  ASSERT_TRUE(d->Forward(std::span<const SeqStep>(&next, 1), lb).ok());
  EXPECT_LT(RelErr(lb, lc), 1e-1);
  // CopyBlocks moves fp8 blocks whole.
  const cache::KvBlockCopy cp{0, s.tables[0][0], kBlocks - 1};
  ASSERT_TRUE(a->CopyBlocks(std::span<const cache::KvBlockCopy>(&cp, 1)).ok());
  std::vector<std::byte> x(n), y(n);
  ASSERT_TRUE(a->ReadBlock(0, s.tables[0][0], x).ok());
  ASSERT_TRUE(a->ReadBlock(0, kBlocks - 1, y).ok());
  EXPECT_EQ(x, y);
}

// fp8 decode graphs (tables widening mid-run, as GraphsMatchDirectLaunches)
// against direct launches, and pipelined steps against step by step: the
// same kernels on the same inputs, so the same picks and (within bf16
// reduction noise) logits.
TEST(CudaBackend, Fp8GraphsAndPipelinedStepsMatch) {
  AGENTKV_REQUIRE_GPU();
  model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const MapWeights w = Bf16Weights(c, 12);
  auto a = MakeCuda(c, w, 4, true, cache::KvDtype::kFP8E4M3);
  auto b = MakeCuda(c, w, 4, false, cache::KvDtype::kFP8E4M3);
  ASSERT_TRUE(a && b);
  const auto ga = Drive(*a, 64, 24, 8);
  const auto gb = Drive(*b, 64, 24, 8);
  EXPECT_GT(a->graph_steps(), 0);
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_LT(RelErr(ga[i], gb[i]), 1e-2) << "row " << i;
  for (bool graphs : {true, false}) {
    auto x = MakeCuda(c, w, 4, graphs, cache::KvDtype::kFP8E4M3);
    auto y = MakeCuda(c, w, 4, graphs, cache::KvDtype::kFP8E4M3);
    ASSERT_TRUE(x && y);
    const std::vector<int32_t> want = GreedyPicks(*x, 24, /*pipelined=*/false, 8);
    EXPECT_EQ(GreedyPicks(*y, 24, /*pipelined=*/true, 8), want) << "graphs " << graphs;
  }
}

TEST(CudaBackend, Fp8RefusesMisalignedBlocks) {
  AGENTKV_REQUIRE_GPU();
  model::ModelConfig c = SmallConfig(model::Architecture::kLlama);  // 2 KV heads
  const MapWeights w = Bf16Weights(c, 15);
  CudaBackendOptions o;
  o.kv_dtype = cache::KvDtype::kFP8E4M3;
  auto b = CudaBackend::Create(c, w, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  KvLayout layout;
  layout.block_size = 1;  // 1 x 2 heads: sections not 16-byte aligned
  layout.blocks_per_group[0] = 8;
  EXPECT_EQ((*b)->AllocateKv(layout).code(), StatusCode::kInvalidArgument);
  o.kv_dtype = cache::KvDtype::kF32;
  EXPECT_EQ(CudaBackend::Create(c, w, o).status().code(), StatusCode::kInvalidArgument);
}
}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaBackendFp8, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
