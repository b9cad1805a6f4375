// The CPU backend on quantized checkpoints: a model written by `model synth
// --quant fp8` (128x128 block scales) or `--quant fp8-channel`
// (compressed-tensors, per-channel scales) gives the logits of the same
// model with its weights dequantized by this test (its own e4m3 decode) and
// stored as fp32, and its weights take their quantized size in memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "../../model/quant_test_util.h"
#include "../../test_model.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_weights.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_spec.h"
#include "util/bf16.h"

#include "quant_steps.h"

namespace agentkv::backend::cpu {
namespace {

using testing::ExpectSameLogits;
using testing::GreedySteps;

namespace fs = std::filesystem;
using testing::MapWeights;
using testing::RefE4m3;

const fs::path kTokenizers = fs::path(AGENTKV_DATA_DIR) / "tokenizers";

// Every expected tensor of `config` as fp32, read from the checkpoint by hand:
// bf16 converted, F8_E4M3 decoded and multiplied by its scale.
MapWeights Dequantized(const model::ModelConfig& config, const model::Safetensors& st) {
  MapWeights out;
  for (const model::WeightSpec& spec : model::ExpectedWeights(config)) {
    auto t = st.Get(spec.name, spec.shape);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    std::vector<float>& v = out.t[spec.name];
    v.resize(t->numel());
    const auto* bytes = static_cast<const uint8_t*>(t->data);
    if (t->dtype == model::TensorDtype::kBF16) {
      for (int64_t i = 0; i < t->numel(); ++i)
        v[i] = Bf16ToF32(static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
      continue;
    }
    if (t->dtype == model::TensorDtype::kF32) {
      std::memcpy(v.data(), t->data, t->nbytes);
      continue;
    }
    EXPECT_EQ(t->dtype, model::TensorDtype::kF8E4M3) << spec.name;
    const int64_t rows = spec.shape[0], cols = spec.shape[1];
    const bool block = st.Has(spec.name + "_scale_inv");
    auto s = st.Get(spec.name + (block ? "_scale_inv" : "_scale"));
    EXPECT_TRUE(s.ok()) << spec.name;
    EXPECT_EQ(s->dtype, model::TensorDtype::kF32);
    const auto* scale = static_cast<const float*>(s->data);
    const int64_t tiles = (cols + 127) / 128;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[r * cols + c] =
            RefE4m3(bytes[r * cols + c]) * (block ? scale[(r / 128) * tiles + c / 128] : scale[r]);
  }
  return out;
}

// Bytes the backend should hold: F8 codes and F32 scales as stored, the
// tied bf16 embedding as bf16, every other tensor as fp32.
uint64_t ExpectedBytes(const model::Safetensors& st) {
  uint64_t n = 0;
  for (const std::string& name : st.Names()) {
    auto t = st.Get(name);
    if (t->dtype == model::TensorDtype::kF8E4M3 || t->dtype == model::TensorDtype::kF32) {
      n += t->nbytes;
    } else if (name == "model.embed_tokens.weight") {
      n += t->numel() * 2;
    } else {
      n += t->numel() * 4;
    }
  }
  return n;
}

// The checkpoint in `dir` on the CPU backend against the same model with its
// weights dequantized by this test, and its weight memory.
void ExpectMatchesDequantized(const fs::path& dir) {
  auto config = model::ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->quant.quantized());
  auto weights = model::SafetensorsWeights::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  ASSERT_TRUE(weights->IsQuantized("model.layers.1.mlp.down_proj.weight"));
  ASSERT_FALSE(weights->IsQuantized("model.embed_tokens.weight"));
  auto quant = CpuBackend::Create(*config, *weights, CpuBackendOptions{2, cache::KvDtype::kF32});
  ASSERT_TRUE(quant.ok()) << quant.status().ToString();

  model::ModelConfig plain = *config;
  plain.quant = model::QuantConfig{};
  const MapWeights deq = Dequantized(plain, weights->safetensors());
  auto ref = CpuBackend::Create(plain, deq, CpuBackendOptions{2, cache::KvDtype::kF32});
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();

  const auto got = GreedySteps(**quant, 3);
  const auto want = GreedySteps(**ref, 3);
  ExpectSameLogits(got, want);
  // Memory: the quantized sizes, well under the fp32 model's.
  EXPECT_EQ((*quant)->weight_bytes(), ExpectedBytes(weights->safetensors()));
  EXPECT_LT((*quant)->weight_bytes(), (*ref)->weight_bytes());
}

class CpuBackendQuantTest : public ::testing::TestWithParam<model::SynthQuant> {
 protected:
  // A small `arch` checkpoint in the test's format, with shapes off the
  // 128-wide scale blocks: hidden 160 (two tiles, the second ragged), q 128
  // rows and k, v 64 (head_dim 32), intermediate 200 (ragged both ways).
  // Empty if it could not be written (the failure added).
  fs::path Synthesize(const std::string& arch, uint64_t seed) const {
    const fs::path dir =
        fs::path(::testing::TempDir()) / ("cpu_quant_" + arch + "_" + std::to_string(::getpid()) +
                                          "_" + std::to_string(static_cast<int>(GetParam())));
    model::SynthOptions o;
    o.arch = arch;
    o.tokenizer_dir = kTokenizers / "qwen3";
    o.out_dir = dir;
    o.layers = 2;
    o.hidden = 160;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 32;
    o.intermediate = 200;
    o.seed = seed;
    o.quant = GetParam();
    const Status st = model::SynthesizeModel(o);
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      return {};
    }
    return dir;
  }
};

TEST_P(CpuBackendQuantTest, LogitsEqualTheDequantizedModel) {
  if (!fs::exists(kTokenizers / "qwen3" / "tokenizer.json"))
    GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
  const fs::path dir = Synthesize("qwen3", 5);
  ASSERT_FALSE(dir.empty());
  ExpectMatchesDequantized(dir);
  fs::remove_all(dir);
}

// Gemma 3 (GELU-tanh MLP, sandwich norms, embedding scale) stored fp8: its
// quantized gate_up goes through the same GELU as the float model's.
TEST_P(CpuBackendQuantTest, Gemma3LogitsEqualTheDequantizedModel) {
  if (!fs::exists(kTokenizers / "qwen3" / "tokenizer.json"))
    GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
  const fs::path dir = Synthesize("gemma3", 6);
  ASSERT_FALSE(dir.empty());
  auto config = model::ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->activation, model::Activation::kGeluTanh);

  ExpectMatchesDequantized(dir);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Formats, CpuBackendQuantTest,
                         ::testing::Values(model::SynthQuant::kFp8,
                                           model::SynthQuant::kFp8Channel));

// Modules a checkpoint leaves unconverted load as float beside quantized
// ones, also inside a fused stack: layer 0's q_proj (first of q | k | v) and
// layer 1's v_proj (last) stored as F32.
TEST(CpuBackendQuantMixedTest, UnconvertedModulesInsideAQuantizedStack) {
  if (!fs::exists(kTokenizers / "qwen3" / "tokenizer.json"))
    GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
  const fs::path root =
      fs::path(::testing::TempDir()) / ("cpu_quant_mixed_" + std::to_string(::getpid()));
  model::SynthOptions o;
  o.arch = "qwen3";
  o.tokenizer_dir = kTokenizers / "qwen3";
  o.out_dir = root / "fp8";
  o.layers = 2;
  o.hidden = 160;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 32;
  o.intermediate = 200;
  o.seed = 8;
  o.quant = model::SynthQuant::kFp8;
  ASSERT_TRUE(model::SynthesizeModel(o).ok());
  auto config = model::ModelConfig::Load(o.out_dir);
  ASSERT_TRUE(config.ok());
  auto st = model::Safetensors::Open(o.out_dir);
  ASSERT_TRUE(st.ok());
  model::ModelConfig plain = *config;
  plain.quant = model::QuantConfig{};
  const MapWeights deq = Dequantized(plain, *st);
  const std::set<std::string> as_f32 = {"model.layers.0.self_attn.q_proj.weight",
                                        "model.layers.1.self_attn.v_proj.weight"};
  std::vector<model::SafetensorsWriter::Tensor> tensors;
  for (const std::string& name : st->Names()) {
    if (as_f32.count(name.substr(0, name.size() - 10)) && name.ends_with("_scale_inv")) continue;
    auto t = st->Get(name);
    model::SafetensorsWriter::Tensor w{name, t->dtype, t->shape, {}};
    if (as_f32.count(name)) {
      const std::vector<float>& v = deq.t.at(name);
      w.dtype = model::TensorDtype::kF32;
      w.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    } else {
      w.bytes.assign(static_cast<const char*>(t->data), t->nbytes);
    }
    tensors.push_back(std::move(w));
  }
  const fs::path mixed = root / "mixed";
  fs::create_directories(mixed);
  for (const auto& e : fs::directory_iterator(o.out_dir))
    if (e.path().extension() == ".json") fs::copy_file(e.path(), mixed / e.path().filename());
  ASSERT_TRUE(model::SafetensorsWriter::WriteFile(mixed / "model.safetensors", tensors).ok());
  auto w = model::SafetensorsWeights::Open(mixed);
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->IsQuantized("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(w->IsQuantized("model.layers.0.self_attn.k_proj.weight"));
  ExpectMatchesDequantized(mixed);
  fs::remove_all(root);
}

// A checkpoint whose weights are F8 but whose config.json lost its
// quantization_config fails to load, naming the tensor.
TEST(CpuBackendQuantErrorTest, Fp8WeightsWithoutAQuantizationConfig) {
  if (!fs::exists(kTokenizers / "qwen3" / "tokenizer.json"))
    GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("cpu_quant_noconfig_" + std::to_string(::getpid()));
  model::SynthOptions o;
  o.arch = "qwen3";
  o.tokenizer_dir = kTokenizers / "qwen3";
  o.out_dir = dir;
  o.layers = 1;
  o.hidden = 64;
  o.quant = model::SynthQuant::kFp8;
  ASSERT_TRUE(model::SynthesizeModel(o).ok());
  auto config = model::ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok());
  config->quant = model::QuantConfig{};
  auto weights = model::SafetensorsWeights::Open(dir);
  ASSERT_TRUE(weights.ok());
  auto b = CpuBackend::Create(*config, *weights, CpuBackendOptions{1, cache::KvDtype::kF32});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("q_proj.weight"), std::string::npos) << b.status().ToString();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace agentkv::backend::cpu
