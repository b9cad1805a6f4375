// CudaBackend on quantized checkpoints written by `model synth`: GPT-OSS
// with MXFP4 experts, Qwen3-MoE with FP8 block experts and attention (and
// with its experts alone quantized, the rest served dequantized by this
// test's weight source), dense Qwen3 in FP8 with block and per-channel
// scales, against the CPU backend on the same checkpoint (which
// dequantizes the same codes), batched and chunked
// as backend_test.cc drives them, the GPU teacher-forced with the CPU's
// picks. Routers are random, so near ties may send a row to other experts:
// the tolerances are backend_test.cc's for random routing (mean relative
// L2 error under 4e-2, at most a fifth of the rows past 6e-2). The experts
// and dense projections take their stored size in GPU memory (fp8 dense
// scales expanded to one per row and block of columns); experts the kernels
// cannot read are refused at creation, saying why.
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend_test_util.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/gemm_plan.h"
#include "engine/model/model_config.h"
#include "engine/model/model_synth.h"
#include "engine/model/quant_format.h"
#include "engine/model/safetensors_weights.h"
#include "synth_checkpoint.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;
namespace fs = std::filesystem;

// A checkpoint's weights with only some of its quantized tensors served
// quantized (`keep` true for the name); the others dequantized to fp32 (by
// the CPU's DequantizeRows), as if the checkpoint stored them so.
class PartlyQuantized : public model::WeightSource {
 public:
  PartlyQuantized(const model::WeightSource& base, model::QuantConfig quant,
                  bool (*keep)(const std::string&))
      : base_(base), quant_(std::move(quant)), keep_(keep) {}
  bool Has(const std::string& name) const override {
    return base_.Has(name) || (base_.IsQuantized(name) && !keep_(name));
  }
  bool IsQuantized(const std::string& name) const override {
    return base_.IsQuantized(name) && keep_(name);
  }
  Result<std::vector<float>> LoadF32(const std::string& name,
                                     std::span<const int64_t> shape) const override {
    if (!base_.IsQuantized(name)) return base_.LoadF32(name, shape);
    if (keep_(name)) return InvalidArgument(name + " is quantized");
    // GPT-OSS's float experts are [E, in, out], its quantized ones [E, out,
    // in]: read the latter and transpose.
    const bool gpt_oss_experts = shape.size() == 3;
    std::vector<int64_t> qshape(shape.begin(), shape.end());
    if (gpt_oss_experts) std::swap(qshape[1], qshape[2]);
    ASSIGN_OR_RETURN(model::QuantizedWeight q, base_.LoadQuantized(name, qshape, quant_));
    std::vector<float> out(static_cast<size_t>(q.batch * q.rows * q.cols));
    for (int64_t b = 0; b < q.batch; ++b)
      DequantizeRows(q, b, 0, q.rows, out.data() + b * q.rows * q.cols);
    if (!gpt_oss_experts) return out;
    std::vector<float> t(out.size());
    for (int64_t b = 0; b < q.batch; ++b)
      for (int64_t r = 0; r < q.rows; ++r)
        for (int64_t k = 0; k < q.cols; ++k)
          t[(b * q.cols + k) * q.rows + r] = out[(b * q.rows + r) * q.cols + k];
    return t;
  }
  Result<std::vector<uint16_t>> LoadBf16IfStored(const std::string& name,
                                                 std::span<const int64_t> shape) const override {
    return base_.LoadBf16IfStored(name, shape);
  }
  Result<model::QuantizedWeight> LoadQuantized(const std::string& name,
                                               std::span<const int64_t> shape,
                                               const model::QuantConfig& quant) const override {
    if (!keep_(name)) return InvalidArgument(name + " is served dequantized");
    return base_.LoadQuantized(name, shape, quant);
  }

 private:
  const model::WeightSource& base_;
  model::QuantConfig quant_;
  bool (*keep_)(const std::string&);
};

bool Experts(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }
// Expert 0's weights only (of every layer).
bool ExpertZero(const std::string& name) {
  return name.find(".mlp.experts.0.") != std::string::npos;
}
bool Nothing(const std::string&) { return false; }

// The tolerance of a quantized backend against the CPU's logits rows: a
// mean relative error under 4e-2 with at most a fifth of the rows past
// 6e-2 (random routers and fp8 activations move a few rows further).
// Returns the mean.
double ExpectNearOnAverage(const std::vector<std::vector<float>>& got,
                           const std::vector<std::vector<float>>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double sum = 0;
  int over = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double e = RelErr(got[i], ref[i]);
    sum += e;
    over += e >= 6e-2;
  }
  const double mean = ref.empty() ? 0 : sum / ref.size();
  EXPECT_LT(mean, 4e-2) << "mean logits error";
  EXPECT_LE(over * 5, static_cast<int>(ref.size())) << "rows past 6e-2: " << over;
  return mean;
}

class CudaBackendQuant : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveSynthTokenizer()) GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
    dir_ = fs::path(::testing::TempDir()) /
           ("cuda_quant_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  model::SynthOptions Base(const std::string& arch, model::SynthQuant quant) const {
    return SynthBase(arch, quant, dir_, 21);
  }
  // Writes the checkpoint `o` describes (into dir_) and opens it: config()
  // and weights() until the next call.
  ::testing::AssertionResult Synthesize(const model::SynthOptions& o) {
    return WriteAndOpen(o, &ck_);
  }
  const model::ModelConfig& config() const { return ck_.config; }
  const model::SafetensorsWeights& weights() const { return *ck_.weights; }

  // The CPU and CUDA backends on `w`, driven as backend_test.cc does;
  // returns the CUDA backend's weight bytes.
  uint64_t ExpectCudaMatchesCpu(const model::ModelConfig& c, const model::WeightSource& w,
                                const CudaTuning& tuning = CudaTuning{}) {
    auto cpu = MakeCpu(c, w, 16);
    auto gpu = MakeCuda(c, w, 16, tuning);
    if (!cpu || !gpu) return 0;
    std::vector<int32_t> picks;
    const auto ref = Drive(*cpu, 16, 10, 5, nullptr, &picks);
    const auto got = Drive(*gpu, 16, 10, 5, &picks);
    std::printf("mean logits rel err %.2e over %zu rows\n", ExpectNearOnAverage(got, ref),
                ref.size());
    return gpu->weight_bytes();
  }

  // The weight bytes of a CUDA backend on `w` with every quantized tensor
  // served dequantized (bf16 on the GPU): what the quantized forms save
  // against. None (the reason added as a failure) if it cannot be made.
  static std::optional<uint64_t> DequantizedWeightBytes(const model::ModelConfig& c,
                                                        const model::WeightSource& w) {
    const PartlyQuantized plain(w, c.quant, Nothing);
    auto ref = CudaBackend::Create(c, plain, CudaBackendOptions{});
    if (!ref.ok()) {
      ADD_FAILURE() << ref.status().ToString();
      return std::nullopt;
    }
    return (*ref)->weight_bytes();
  }

  fs::path dir_;
  SynthCheckpoint ck_;
};

// The bytes a layer's experts take as bf16 and as stored.
uint64_t ExpertBf16Bytes(const model::ModelConfig& c) {
  return static_cast<uint64_t>(c.moe.num_experts) * 3 * c.hidden_size * c.moe.expert_intermediate *
         2;
}

// The bytes a layer's fp8 dense projections save against bf16 (attention,
// and the MLP where `mlp`): a byte a value and an fp32 scale per row and
// block of 128 columns (`block`), or per row.
uint64_t DenseBytesSaved(const model::ModelConfig& c, bool block, bool mlp) {
  const int64_t H = c.hidden_size, nq = c.num_heads * c.head_dim;
  const int64_t nkv = c.num_kv_heads * c.head_dim, I = mlp ? c.intermediate_size : 0;
  auto fp8 = [&](int64_t rows, int64_t cols) {
    return rows * cols + rows * (block ? (cols + 127) / 128 : 1) * 4;
  };
  const int64_t bf16 = 2 * ((nq + 2 * nkv) * H + H * nq + 2 * I * H + H * I);
  const int64_t stored = fp8(nq + 2 * nkv, H) + fp8(H, nq) + (mlp ? fp8(2 * I, H) + fp8(H, I) : 0);
  return static_cast<uint64_t>(bf16 - stored);
}

TEST_F(CudaBackendQuant, GptOssMxfp4ExpertsMatchTheCpu) {
  AGENTKV_REQUIRE_GPU();
  model::SynthOptions o = Base("gpt_oss", model::SynthQuant::kMxfp4);
  SmallGptOssShape(&o, 96);  // 3 blocks of 32 into down_proj
  ASSERT_TRUE(Synthesize(o));
  const model::ModelConfig& c = config();
  const model::SafetensorsWeights& w = weights();
  ASSERT_TRUE(w.IsQuantized("model.layers.0.mlp.experts.gate_up_proj"));
  const uint64_t quant = ExpectCudaMatchesCpu(c, w);
  // The same model with its experts dequantized takes bf16 experts.
  const std::optional<uint64_t> ref = DequantizedWeightBytes(c, w);
  ASSERT_TRUE(ref);
  // mxfp4: half a byte a value and a byte per 32.
  const uint64_t values = ExpertBf16Bytes(c) / 2;
  EXPECT_EQ(*ref - quant, (2 * values - values / 2 - values / model::kMxfp4Block) * c.num_layers);
}

TEST_F(CudaBackendQuant, Qwen3MoeFp8ExpertsMatchTheCpu) {
  AGENTKV_REQUIRE_GPU();
  model::SynthOptions o = Base("qwen3_moe", model::SynthQuant::kFp8);
  o.hidden = 160;  // two 128-wide blocks, the second ragged
  o.head_dim = 32;
  o.experts = 4;
  o.experts_per_token = 2;
  o.moe_intermediate = 144;  // ragged both ways, whole 16-value loads
  ASSERT_TRUE(Synthesize(o));
  const model::ModelConfig& c = config();
  const model::SafetensorsWeights& w = weights();
  ASSERT_TRUE(w.IsQuantized("model.layers.1.mlp.experts.3.up_proj.weight"));
  // The checkpoint as it is (its attention fp8 too), then its experts
  // alone quantized.
  const uint64_t all = ExpectCudaMatchesCpu(c, w);
  const PartlyQuantized experts(w, c.quant, Experts);
  const uint64_t quant = ExpectCudaMatchesCpu(c, experts);
  const std::optional<uint64_t> ref = DequantizedWeightBytes(c, w);
  ASSERT_TRUE(ref);
  // fp8: a byte a value, and per expert fp32 scales of 2 x 2 blocks
  // (gate, up: 144 rows x 160 columns) and 2 x 2 (down: 160 x 144).
  const int64_t E = c.moe.num_experts;
  const uint64_t stored = ExpertBf16Bytes(c) / 2 + static_cast<uint64_t>(E) * (2 * 4 + 4) * 4;
  EXPECT_EQ(*ref - quant, (ExpertBf16Bytes(c) - stored) * c.num_layers);
  EXPECT_EQ(quant - all, DenseBytesSaved(c, true, false) * c.num_layers);
}

// Dense fp8 checkpoints (Qwen3-*-FP8's block scales; compressed-tensors'
// per-channel scales): every projection quantized, rows and columns off
// the 128-blocks.
TEST_F(CudaBackendQuant, Qwen3Fp8DenseMatchesTheCpu) {
  AGENTKV_REQUIRE_GPU();
  for (const model::SynthQuant q : {model::SynthQuant::kFp8, model::SynthQuant::kFp8Channel}) {
    fs::remove_all(dir_);
    model::SynthOptions o = Base("qwen3", q);
    SmallDenseShape(&o, 272);
    ASSERT_TRUE(Synthesize(o));
    const model::ModelConfig& c = config();
    const model::SafetensorsWeights& w = weights();
    ASSERT_TRUE(w.IsQuantized("model.layers.1.mlp.down_proj.weight"));
    const uint64_t quant = ExpectCudaMatchesCpu(c, w);
    const std::optional<uint64_t> ref = DequantizedWeightBytes(c, w);
    ASSERT_TRUE(ref);
    EXPECT_EQ(*ref - quant, DenseBytesSaved(c, q == model::SynthQuant::kFp8, true) * c.num_layers)
        << "quant " << static_cast<int>(q);
  }
}

// Gemma 3 stored fp8 (block scales, and compressed-tensors' per-channel
// ones): its MLP is gelu_tanh(gate) * up, which every quantized gate_up
// path applies as the bf16 layers do. Against the CPU on each path: by
// default the GEMV's epilogue for decode steps (3 rows) and the weights
// dequantized for the bf16 GEMMs and the activation kernel for prompt
// steps (35 rows); with the dequantization off the quantized tiles'
// epilogue for prompt steps; with the GEMV off too, the tiles for every
// step. (Sandwich norms: o and down are stored, never added.)
TEST_F(CudaBackendQuant, Gemma3Fp8GeluMlpMatchesTheCpu) {
  AGENTKV_REQUIRE_GPU();
  for (const model::SynthQuant q : {model::SynthQuant::kFp8, model::SynthQuant::kFp8Channel}) {
    fs::remove_all(dir_);
    model::SynthOptions o = Base("gemma3", q);
    o.hidden = 160;
    o.head_dim = 32;
    o.intermediate = 272;
    ASSERT_TRUE(model::SynthesizeModel(o).ok());
    auto c = model::ModelConfig::Load(dir_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_EQ(c->activation, model::Activation::kGeluTanh);
    auto w = model::SafetensorsWeights::Open(dir_);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->IsQuantized("model.layers.1.mlp.gate_proj.weight"));
    CudaTuning t;
    std::printf("quant %d, default paths: ", static_cast<int>(q));
    ExpectCudaMatchesCpu(*c, *w, t);
    t.dense_dequant = false;
    std::printf("quant %d, quantized tiles for prompt steps: ", static_cast<int>(q));
    ExpectCudaMatchesCpu(*c, *w, t);
    t.moe_gemv = false;
    std::printf("quant %d, quantized tiles for every step: ", static_cast<int>(q));
    ExpectCudaMatchesCpu(*c, *w, t);
  }
}

// Dense fp8 steps of many tokens (prompt chunks of 32 beside the others':
// 55 tokens, past kDenseQuantGemvMaxRows) run on their weights dequantized
// to bf16: against the CPU within the tolerances above, and against the
// quantized tiles (AGENTKV_CUDA_DENSE_DEQUANT=0) closely: the same bf16
// weights, but the sums in another order and, as in bf16 layers, gate and
// up rounded to bf16 before the activation where the tiles take them in
// fp32 (relative L2 error per row under 1e-2, the kernel tests' bar for
// bf16 outputs; wrong weights would be off by about 1). The scratch holds the largest projection
// (gate_up) in bf16; none is allocated with the switch off.
TEST_F(CudaBackendQuant, Qwen3Fp8DenseManyTokenStepsRunDequantized) {
  AGENTKV_REQUIRE_GPU();
  model::SynthOptions o = Base("qwen3", model::SynthQuant::kFp8);
  SmallDenseShape(&o, 272);
  ASSERT_TRUE(Synthesize(o));
  const model::ModelConfig& c = config();
  const model::SafetensorsWeights& w = weights();
  const int H = c.hidden_size, I = c.intermediate_size;
  GemmModel g;
  g.quant_dequant = true;
  ASSERT_TRUE(UseDequantGemm(g, 55, 2 * I, H));  // the first step's rows
  auto cpu = MakeCpu(c, w, 16);
  ASSERT_TRUE(cpu);
  std::vector<int32_t> picks;
  const auto ref = Drive(*cpu, 32, 6, 7, nullptr, &picks);
  std::vector<std::vector<float>> got[2];
  for (const bool dequant : {true, false}) {
    CudaTuning tuning;
    tuning.dense_dequant = dequant;
    auto gpu = MakeCuda(c, w, 16, tuning);
    ASSERT_TRUE(gpu);
    EXPECT_EQ(gpu->dequant_scratch_bytes(), dequant ? uint64_t{2} * I * H * 2 : 0);
    got[dequant ? 0 : 1] = Drive(*gpu, 32, 6, 7, &picks);
    ASSERT_EQ(got[dequant ? 0 : 1].size(), ref.size());
  }
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_LT(RelErr(got[0][i], got[1][i]), 1e-2) << "row " << i << " against the tiles";
  std::printf("dequantized: mean logits rel err %.2e against the cpu\n",
              ExpectNearOnAverage(got[0], ref));
}

// With the quantized GEMV off every step dequantizes (UseDequantGemm from
// one row), decode steps of three sequences included, which run as CUDA
// graphs: the graphs replay the dequantization and the bf16 GEMMs after it
// (launched without programmatic dependent launch) and still match the
// CPU within the tolerances above.
TEST_F(CudaBackendQuant, Qwen3Fp8DenseDequantizedInDecodeGraphs) {
  AGENTKV_REQUIRE_GPU();
  model::SynthOptions o = Base("qwen3", model::SynthQuant::kFp8Channel);
  SmallDenseShape(&o, 272);
  ASSERT_TRUE(Synthesize(o));
  const model::ModelConfig& c = config();
  const model::SafetensorsWeights& w = weights();
  GemmModel g;
  g.quant_dequant = true;
  g.quant_gemv = false;
  ASSERT_TRUE(UseDequantGemm(g, 3, c.hidden_size, c.intermediate_size));
  auto cpu = MakeCpu(c, w, 16);
  ASSERT_TRUE(cpu);
  std::vector<int32_t> picks;
  const auto ref = Drive(*cpu, 16, 10, 9, nullptr, &picks);
  CudaBackendOptions bo;
  bo.max_step_tokens = 64;
  bo.max_batch = 4;
  bo.tuning.moe_gemv = false;
  auto gpu = CudaBackend::Create(c, w, bo);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  ASSERT_GT((*gpu)->dequant_scratch_bytes(), 0u);
  ASSERT_TRUE(AllocateTestKv(**gpu, 16));
  const auto got = Drive(**gpu, 16, 10, 9, &picks);
  EXPECT_GT((*gpu)->graph_steps(), 0);
  ExpectNearOnAverage(got, ref);
}

// Quantized experts the kernels do not read are refused at creation, with
// the reason: per-channel fp8 (compressed-tensors), and a layer whose
// experts are quantized in part.
TEST_F(CudaBackendQuant, RefusesExpertsTheKernelsCannotRead) {
  AGENTKV_REQUIRE_GPU();
  model::SynthOptions o = Base("qwen3_moe", model::SynthQuant::kFp8Channel);
  o.hidden = 64;
  o.experts = 4;
  o.experts_per_token = 2;
  o.moe_intermediate = 32;
  ASSERT_TRUE(Synthesize(o));
  const model::ModelConfig& c = config();
  const model::SafetensorsWeights& w = weights();
  const PartlyQuantized channel(w, c.quant, Experts);
  auto b = CudaBackend::Create(c, channel, CudaBackendOptions{});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("fp8-channel"), std::string::npos) << b.status().ToString();
  const PartlyQuantized some(w, c.quant, ExpertZero);
  b = CudaBackend::Create(c, some, CudaBackendOptions{});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("some experts quantized"), std::string::npos)
      << b.status().ToString();
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaBackendQuant, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
