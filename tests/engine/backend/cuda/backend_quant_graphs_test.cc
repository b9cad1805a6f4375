// Decode steps of quantized checkpoints run as CUDA graphs, as those of
// bf16 ones do: every kernel such a step launches (the quantized GEMV with
// its gated or residual epilogue, its shared-memory limit set on its first
// launch inside the capture, the dequantization into the bf16 scratch
// and the GEMMs after it, the MoE router, routing, grouping and expert
// kernels) is captured. For each checkpoint `model synth` writes (dense
// Qwen3 fp8 with block scales, also with an MLP 8,192 wide; the same with
// per-channel scales and the quantized GEMV off, so that its decode graphs
// replay the dequantization; Gemma 3 fp8, its GELU MLP; Qwen3-MoE fp8;
// GPT-OSS with MXFP4 experts), two backends as the engine makes them (AllocateKv, then
// Reserve for its step budget and batch), graphs on and off, driven alike
// (backend_test_util.h's three sequences, the same tokens forced on both):
// - Reserve captured the graphs before any step, and the steps captured
//   none more (the tables stay within the reserved width);
// - decode steps ran from the graphs (graph_steps), none without graphs;
// - every logits row of the graph backend within 1e-2 relative L2 of the
//   one without (backend_test.cc's bar for graphs against direct launches:
//   the graph pads three sequences to the bucket of four and splits
//   attention by the bucket, so sums run in another order), and its argmax
//   the same token wherever the two rows could not swap the top two (the
//   top-two gap wider than twice the rows' largest difference).
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "engine/backend/cuda/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors_weights.h"
#include "synth_checkpoint.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;
namespace fs = std::filesystem;

struct QuantCase {
  std::string name;
  std::string arch;
  model::SynthQuant quant;
  bool quant_gemv = true;  // CudaTuning::moe_gemv
  int intermediate = 272;  // dense models' MLP width
};

class CudaBackendQuantGraphs : public ::testing::TestWithParam<QuantCase> {
 protected:
  void SetUp() override {
    if (!HaveSynthTokenizer()) GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
    dir_ = fs::path(::testing::TempDir()) /
           ("cuda_quant_graphs_" + std::to_string(::getpid()) + "_" + GetParam().name);
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // The case's checkpoint, small, with shapes off the 128-blocks.
  void Synthesize(const QuantCase& q) const {
    model::SynthOptions o;
    o.arch = q.arch;
    o.tokenizer_dir = Tokenizers() / "qwen3";
    o.out_dir = dir_;
    o.layers = 2;
    o.heads = 4;
    o.kv_heads = 2;
    o.seed = 23;
    o.lm_head_std = 0.5;
    o.quant = q.quant;
    if (q.arch == "gpt_oss") {
      o.hidden = 64;
      o.head_dim = 16;
      o.intermediate = 96;
      o.experts = 5;
      o.experts_per_token = 2;
      o.sliding_window = 8;
    } else if (q.arch == "qwen3_moe") {
      o.hidden = 160;
      o.head_dim = 32;
      o.experts = 4;
      o.experts_per_token = 2;
      o.moe_intermediate = 144;
    } else {
      o.hidden = 160;
      o.head_dim = 32;
      o.intermediate = q.intermediate;
    }
    const Status st = model::SynthesizeModel(o);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  fs::path dir_;
};

std::unique_ptr<CudaBackend> Make(const model::ModelConfig& c, const model::WeightSource& w,
                                  bool graphs, bool quant_gemv) {
  CudaBackendOptions o;
  o.max_step_tokens = 64;
  o.max_batch = 2;
  o.tuning.graphs = graphs;
  o.tuning.moe_gemv = quant_gemv;
  auto b = CudaBackend::Create(c, w, o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return nullptr;
  if (!AllocateTestKv(**b, 16)) return nullptr;
  // As the engine sizes a backend: its step budget and batch.
  const Status st = (*b)->Reserve(64, 4);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return nullptr;
  return std::move(b).value();
}

TEST_P(CudaBackendQuantGraphs, DecodeStepsReplayGraphsAndMatchDirectLaunches) {
  AGENTKV_REQUIRE_GPU();
  const QuantCase q = GetParam();
  ASSERT_NO_FATAL_FAILURE(Synthesize(q));
  auto c = model::ModelConfig::Load(dir_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->quant.quantized());
  auto w = model::SafetensorsWeights::Open(dir_);
  ASSERT_TRUE(w.ok()) << w.status().ToString();

  auto plain = Make(*c, *w, /*graphs=*/false, q.quant_gemv);
  auto graphs = Make(*c, *w, /*graphs=*/true, q.quant_gemv);
  ASSERT_TRUE(plain && graphs);
  EXPECT_EQ(plain->graphs_captured(), 0);
  const int64_t captured = graphs->graphs_captured();
  EXPECT_GT(captured, 0) << "Reserve captured no decode graph";

  std::vector<int32_t> picks;
  const auto want = Drive(*plain, 16, 10, 13, nullptr, &picks);
  const auto got = Drive(*graphs, 16, 10, 13, &picks);
  EXPECT_EQ(plain->graph_steps(), 0);
  // (Every decode round but the first, which also completes the longest
  // prompt: nine steps of three sequences decoding.)
  EXPECT_GE(graphs->graph_steps(), 9) << "decode steps ran without graphs";
  EXPECT_EQ(graphs->graphs_captured(), captured) << "a step captured graphs again";

  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = RelErr(got[i], want[i]);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-2) << "row " << i;
    // The argmax may differ only where the rows' difference could swap
    // the top two.
    const std::vector<float>& a = want[i];
    const std::vector<float>& b = got[i];
    float diff = 0;
    for (size_t v = 0; v < a.size(); ++v) diff = std::max(diff, std::fabs(a[v] - b[v]));
    const auto top = static_cast<size_t>(std::max_element(a.begin(), a.end()) - a.begin());
    float second = -INFINITY;
    for (size_t v = 0; v < a.size(); ++v)
      if (v != top) second = std::max(second, a[v]);
    const auto btop = static_cast<size_t>(std::max_element(b.begin(), b.end()) - b.begin());
    if (a[top] - second > 2 * diff) {
      EXPECT_EQ(btop, top) << "row " << i;
    }
  }
  std::printf("%s: %lld graph steps, %lld graphs, worst row %.2e over %zu rows\n", q.name.c_str(),
              static_cast<long long>(graphs->graph_steps()), static_cast<long long>(captured),
              worst, want.size());
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, CudaBackendQuantGraphs,
    ::testing::Values(QuantCase{"qwen3_fp8", "qwen3", model::SynthQuant::kFp8},
                      QuantCase{"qwen3_fp8_channel_dequant", "qwen3",
                                model::SynthQuant::kFp8Channel, /*quant_gemv=*/false},
                      // down's rows of 8,192: the quantized GEMV stages more
                      // than 48 KiB of x and sets its kernel's shared-memory
                      // limit on its first launch, inside the capture (as
                      // Qwen3-8B's projections do).
                      QuantCase{"qwen3_fp8_long_rows", "qwen3", model::SynthQuant::kFp8, true,
                                8192},
                      QuantCase{"gemma3_fp8", "gemma3", model::SynthQuant::kFp8},
                      QuantCase{"qwen3_moe_fp8", "qwen3_moe", model::SynthQuant::kFp8},
                      QuantCase{"gpt_oss_mxfp4", "gpt_oss", model::SynthQuant::kMxfp4}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaBackendQuantGraphs, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
