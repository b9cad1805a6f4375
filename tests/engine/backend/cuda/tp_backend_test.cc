// TpBackend on 2 (and, where present, 4) GPUs against one GPU, on small
// random models of every architecture: teacher-forced logits within bf16
// noise of the single-GPU backend's (only the order of the all-reduced sums
// differs); greedy picks made on the GPUs (argmax keys, pipelined, graphs)
// equal to the argmax of the gathered logits; drawn rows (host mode) as
// step by step; small steps' sums from NCCL windows, large ones' from
// plain buffers, as with windows off; KV blocks saved under one degree
// continue under another;
// quantized checkpoints (fp8 block and per-channel, MXFP4 experts) as on
// one GPU.
// Skips below 2 GPUs.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "../../step_driver.h"
#include "backend_test_util.h"
#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/nccl_windows.h"
#include "engine/backend/cuda/tp_backend.h"
#include "engine/backend/tp_reduce_plan.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors_weights.h"
#include "nccl_test_util.h"
#include "synth_checkpoint.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;

// SmallConfig with MLP and expert sizes that split over 2 and 4 ranks.
model::ModelConfig TpSmallConfig(model::Architecture arch) {
  model::ModelConfig c = SmallConfig(arch);
  c.intermediate_size = 64;
  if (c.IsMoe()) c.moe.expert_intermediate = 32;
  return c;
}

std::unique_ptr<TpBackend> MakeTp(const model::ModelConfig& c, const model::WeightSource& w, int bs,
                                  int degree, bool graphs = true, bool windows = true) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // as main() does
  TpBackendOptions o;
  o.degree = degree;
  o.rank.tuning.graphs = graphs;
  o.rank.max_step_tokens = 64;
  o.rank.max_batch = 2;
  o.nccl.nvls_enable = "0";
  o.nccl.symmetric_windows = windows;
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

// What a TP backend's all-reduces ran from, for failure messages: windows
// (fenced or not, or why none), or plain buffers.
std::string WindowsName(const TpBackend& tp, bool asked) {
  if (!asked) return "windows off";
  if (!tp.residual_in_window())
    return "windows on (none made: " +
           (tp.windows_refused().empty() ? std::string("step past the window")
                                         : tp.windows_refused()) +
           ")";
  return tp.reduce_fenced() ? "windows on (fenced)" : "windows on";
}

// Teacher-forced logits at TP 2 (and 4) against one GPU, with the summed
// buffers in symmetric windows and in plain buffers, each compared apart
// (the MoE layers' combine kernel, launched early behind the expert GEMM,
// is where an all-reduce that starts before its producer finishes shows
// first); then device picks against the gathered argmax.
TEST(TpBackend, LogitsAsOneGpuAndDevicePicksAsTheGatheredArgmax) {
  AGENTKV_REQUIRE_GPUS(2);
  for (int degree : {2, 4}) {
    if (cuda::VisibleGpus() < degree) continue;
    for (model::Architecture arch : kArchs) {
      const model::ModelConfig c = TpSmallConfig(arch);
      const MapWeights w = Bf16Weights(c, 21);
      auto one = MakeCuda(c, w, 4);
      ASSERT_TRUE(one);
      std::vector<int32_t> picks;
      const auto want = Drive(*one, 7, 10, 3, nullptr, &picks);
      for (bool windows : {true, false}) {
        auto tp = MakeTp(c, w, 4, degree, /*graphs=*/true, windows);
        ASSERT_TRUE(tp);
        const std::string name = CaseName({arch, 7, 4}) + " degree " + std::to_string(degree) +
                                 " " + WindowsName(*tp, windows);
        // What the KV records' fingerprint and layout see: as on one GPU.
        EXPECT_EQ(tp->kv_format(), one->kv_format());
        ASSERT_EQ(tp->cache_spec().groups.size(), one->cache_spec().groups.size());
        for (size_t g = 0; g < one->cache_spec().groups.size(); ++g)
          EXPECT_EQ(tp->cache_spec().BytesPerBlock(static_cast<int>(g), 4),
                    one->cache_spec().BytesPerBlock(static_cast<int>(g), 4));
        const auto got = Drive(*tp, 7, 10, 3, &picks);  // teacher-forced
        ASSERT_EQ(want.size(), got.size());
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, RelErr(got[i], want[i]));
        std::printf("%s: worst row rel err %.2e\n", name.c_str(), worst);
        EXPECT_LT(worst, 1e-2) << name;
      }
      // Picks made on the GPUs (pipelined, graphs) equal the argmax of the
      // logits gathered to the host (every third step samples row 1).
      auto a = MakeTp(c, w, 4, degree);
      auto b = MakeTp(c, w, 4, degree, /*graphs=*/false);
      ASSERT_TRUE(a && b);
      EXPECT_EQ(GreedyPicks(*a, 16, /*pipelined=*/true, 9),
                GreedyPicks(*b, 16, /*pipelined=*/false, 9, /*sample_every=*/3))
          << CaseName({arch, 7, 4}) << " degree " << degree << " " << WindowsName(*a, true);
      EXPECT_GT(a->graphs_captured(), 0);
    }
  }
}

// Quantized checkpoints written by `model synth`, each rank loading its cut
// of the codes and scales (TpWeightSource::LoadQuantized): dense Qwen3 in
// fp8 with 128 x 128 block scales (intermediate 320: 160 columns a rank at
// 2, so rank 1's down_proj starts inside a 128-column scale block and both
// ranks share it; 80 at 4) and with per-channel scales, and GPT-OSS with
// MXFP4 experts (intermediate 128: 64 and 32 a rank, whole blocks; 96: 48
// and 24 a rank, each rank holding 64 columns of whole blocks with the ones
// it does not own zeroed, the last rank's padded).
// Tolerance against one GPU on the same checkpoint: the bf16 test's worst
// row under 1e-2 for the dense models (the same dequantized values; only
// the order of the all-reduced sums and the kernels' split of the smaller
// GEMMs differ); for the experts, whose random router may flip a near tie
// between the two runs, a mean under 1e-2 with at most a fifth of the rows
// past 3e-2. Device picks (pipelined, graphs) equal the gathered argmax.
TEST(TpBackend, QuantizedCheckpointsAsOneGpu) {
  AGENTKV_REQUIRE_GPUS(2);
  namespace fs = std::filesystem;
  if (!HaveSynthTokenizer()) GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
  struct Case {
    const char* arch;
    model::SynthQuant quant;
    int intermediate;
  };
  for (const Case& k : {Case{"qwen3", model::SynthQuant::kFp8, 320},
                        Case{"qwen3", model::SynthQuant::kFp8Channel, 320},
                        Case{"gpt_oss", model::SynthQuant::kMxfp4, 128},
                        Case{"gpt_oss", model::SynthQuant::kMxfp4, 96}}) {
    const fs::path dir =
        fs::path(::testing::TempDir()) /
        ("tp_quant_" + std::to_string(::getpid()) + "_" + k.arch + "_" +
         std::to_string(static_cast<int>(k.quant)) + "_" + std::to_string(k.intermediate));
    fs::remove_all(dir);
    model::SynthOptions o = SynthBase(k.arch, k.quant, dir, 31);
    const bool moe = std::string(k.arch) == "gpt_oss";
    if (moe) {
      SmallGptOssShape(&o, k.intermediate);
    } else {
      SmallDenseShape(&o, k.intermediate);
    }
    SynthCheckpoint ck;
    ASSERT_TRUE(WriteAndOpen(o, &ck));
    const model::ModelConfig& c = ck.config;
    const model::SafetensorsWeights& w = *ck.weights;
    ASSERT_TRUE(c.quant.quantized());
    auto one = MakeCuda(c, w, 4);
    ASSERT_TRUE(one);
    std::vector<int32_t> picks;
    const auto want = Drive(*one, 7, 10, 3, nullptr, &picks);
    for (int degree : {2, 4}) {
      if (cuda::VisibleGpus() < degree) continue;
      const std::string name = std::string(k.arch) + " " +
                               std::to_string(static_cast<int>(k.quant)) + " intermediate " +
                               std::to_string(k.intermediate) + " degree " + std::to_string(degree);
      // Windows on and off apart: a failure names which.
      for (bool windows : {true, false}) {
        auto tp = MakeTp(c, w, 4, degree, /*graphs=*/true, windows);
        ASSERT_TRUE(tp) << name;
        const std::string run = name + " " + WindowsName(*tp, windows);
        const auto got = Drive(*tp, 7, 10, 3, &picks);  // teacher-forced
        ASSERT_EQ(want.size(), got.size());
        double worst = 0, sum = 0;
        int over = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double e = RelErr(got[i], want[i]);
          worst = std::max(worst, e);
          sum += e;
          over += e >= 3e-2;
        }
        std::printf("%s: worst row rel err %.2e, mean %.2e\n", run.c_str(), worst,
                    sum / want.size());
        if (moe) {
          EXPECT_LT(sum / want.size(), 1e-2) << run;
          EXPECT_LE(over * 5, static_cast<int>(want.size())) << run << ": rows past 3e-2";
        } else {
          EXPECT_LT(worst, 1e-2) << run;
        }
      }
      auto a = MakeTp(c, w, 4, degree);
      auto b = MakeTp(c, w, 4, degree, /*graphs=*/false);
      ASSERT_TRUE(a && b);
      EXPECT_EQ(GreedyPicks(*a, 16, /*pipelined=*/true, 9),
                GreedyPicks(*b, 16, /*pipelined=*/false, 9, /*sample_every=*/3))
          << name;
    }
    fs::remove_all(dir);
  }
}

// The all-reduced buffers in NCCL symmetric windows (the default) or plain
// (symmetric_windows false): the same logits up to the all-reduce's
// rounding (1e-5: fp32 sums on both paths), the same greedy picks; where
// windows exist the residual lives in one, also after Reserve grows the
// workspaces past the first window (a new one, every rank moved to it),
// and its all-reduces are fenced where the NCCL loaded needs it.
// Gemma 3 sums its o output apart (sandwich norms): in the window too.
TEST(TpBackend, SymmetricWindowsAsPlainBuffers) {
  AGENTKV_REQUIRE_GPUS(2);
  std::string why;
  const bool supported = cuda::NcclWindows::Supported(&why);
  for (model::Architecture arch : {model::Architecture::kQwen3, model::Architecture::kGemma3}) {
    const model::ModelConfig c = TpSmallConfig(arch);
    const MapWeights w = Bf16Weights(c, 19);
    auto on = MakeTp(c, w, 4, 2);
    auto off = MakeTp(c, w, 4, 2, /*graphs=*/true, /*windows=*/false);
    ASSERT_TRUE(on && off);
    EXPECT_FALSE(off->residual_in_window());
    EXPECT_FALSE(off->reduce_fenced());
    EXPECT_TRUE(off->windows_refused().empty());
    if (supported) {
      EXPECT_TRUE(on->residual_in_window()) << on->windows_refused();
      // Fenced exactly where the NCCL loaded starts its symmetric kernels
      // without waiting (TpWindowReduceNeedsFence).
      int major = 0;
      ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
      const int version = cuda::NcclLoadedVersion();
      EXPECT_EQ(on->reduce_fenced(), TpWindowReduceNeedsFence(version, major));
      std::printf("NCCL %d, compute capability %d: all-reduces from windows %s\n", version, major,
                  on->reduce_fenced() ? "fenced" : "unfenced");
    } else {
      EXPECT_FALSE(on->residual_in_window());
      EXPECT_FALSE(on->windows_refused().empty());
      std::printf("no symmetric windows: %s\n", why.c_str());
    }
    std::vector<int32_t> picks;
    const auto want = Drive(*off, 7, 10, 3, nullptr, &picks);
    auto compare = [&](Backend& b, const char* what) {
      const auto got = Drive(b, 7, 10, 3, &picks);
      ASSERT_EQ(want.size(), got.size());
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, RelErr(got[i], want[i]));
      EXPECT_LT(worst, 1e-5) << CaseName({arch, 7, 4}) << " " << what;
    };
    compare(*on, "windows");
    ASSERT_TRUE(on->Reserve(256, 8).ok());
    EXPECT_EQ(on->residual_in_window(), supported);
    compare(*on, "windows after Reserve grew them");
    auto a = MakeTp(c, w, 4, 2);
    ASSERT_TRUE(a);
    EXPECT_EQ(GreedyPicks(*a, 16, /*pipelined=*/true, 9), GreedyPicks(*off, 16, true, 9))
        << CaseName({arch, 7, 4});
  }
}

// Each step sums from the window or from plain buffers by the size of its
// all-reduces (TpReduceFromWindow). At hidden 512 (2 KiB a token, so up to
// 16 tokens from the window) the 68-token prefill step sums 136 KiB from
// plain buffers and the decode steps of 3 sequences (in graphs, padded to
// their bucket) from the window, in one backend: the logits as with
// windows off within 1e-5, the pipelined greedy picks equal. Gemma 3 sums
// its o output too.
TEST(TpBackend, SmallStepsSumFromTheWindowLargeFromPlainBuffers) {
  AGENTKV_REQUIRE_GPUS(2);
  std::string why;
  if (!cuda::NcclWindows::Supported(&why)) GTEST_SKIP() << why;
  for (model::Architecture arch : {model::Architecture::kQwen3, model::Architecture::kGemma3}) {
    model::ModelConfig c = TpSmallConfig(arch);
    c.hidden_size = 512;
    ASSERT_EQ(TpWindowTokens(c), 8);  // 2 KiB a token
    const MapWeights w = Bf16Weights(c, 23);
    auto on = MakeTp(c, w, 4, 2);
    auto off = MakeTp(c, w, 4, 2, /*graphs=*/true, /*windows=*/false);
    ASSERT_TRUE(on && off);
    ASSERT_TRUE(on->residual_in_window()) << on->windows_refused();
    std::vector<int32_t> picks;
    const auto want = Drive(*off, 64, 10, 3, nullptr, &picks);
    const auto got = Drive(*on, 64, 10, 3, &picks);
    ASSERT_EQ(want.size(), got.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, RelErr(got[i], want[i]));
    EXPECT_LT(worst, 1e-5) << CaseName({arch, 64, 4});
    EXPECT_GT(on->plain_reduce_steps(), 0);   // the prefill step
    EXPECT_GT(on->window_reduce_steps(), 0);  // the decode steps
    EXPECT_EQ(off->window_reduce_steps(), 0);
    const int64_t before = on->window_reduce_steps();
    EXPECT_EQ(GreedyPicks(*on, 16, /*pipelined=*/true, 9), GreedyPicks(*off, 16, true, 9))
        << CaseName({arch, 64, 4});
    EXPECT_GE(on->window_reduce_steps(), before + 16);
    EXPECT_GT(on->graphs_captured(), 0);
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
