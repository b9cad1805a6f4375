// Quantized experts on the CPU backend: a GPT-OSS checkpoint written by
// `model synth --quant mxfp4` (experts as `*_blocks` / `*_scales`, [out, in],
// gate and up rows interleaved) and a Qwen3-MoE one written with `--quant
// fp8` (per-expert F8_E4M3 with 128x128 block scales, the router left
// bf16) give the logits of the same model whose experts are the dequantized
// values stored as fp32 in the float layout (GPT-OSS's [E, in, out]), built
// here by this test's own decoders; and the experts take their quantized
// size in memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

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
using ::testing::HasSubstr;
using testing::MapWeights;
using testing::RefE4m3;
using testing::RefFp4;

const fs::path kTokenizers = fs::path(AGENTKV_DATA_DIR) / "tokenizers";

std::vector<float> FloatTensor(const model::TensorView& t) {
  std::vector<float> v(t.numel());
  const auto* b = static_cast<const uint8_t*>(t.data);
  if (t.dtype == model::TensorDtype::kF32) {
    std::memcpy(v.data(), t.data, t.nbytes);
  } else {
    EXPECT_EQ(t.dtype, model::TensorDtype::kBF16) << t.name;
    for (int64_t i = 0; i < t.numel(); ++i)
      v[i] = Bf16ToF32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
  }
  return v;
}

// Every tensor of the float model `plain` (its config without quantization)
// as fp32, read from the checkpoint by hand: float tensors converted; an
// MXFP4 expert matrix [E, out, in] decoded nibble by nibble and written
// back transposed to the float layout [E, in, out]; an F8_E4M3 weight
// decoded and multiplied by its tile's scale_inv.
MapWeights Dequantized(const model::ModelConfig& plain, const model::Safetensors& st) {
  MapWeights out;
  for (const model::WeightSpec& spec : model::ExpectedWeights(plain)) {
    std::vector<float>& v = out.t[spec.name];
    if (st.Has(spec.name + "_blocks")) {
      const int64_t E = spec.shape[0], in = spec.shape[1], rows = spec.shape[2];
      auto b = st.Get(spec.name + "_blocks", {E, rows, in / 32, 16});
      auto s = st.Get(spec.name + "_scales", {E, rows, in / 32});
      EXPECT_TRUE(b.ok() && s.ok()) << spec.name;
      const auto* blocks = static_cast<const uint8_t*>(b->data);
      const auto* scales = static_cast<const uint8_t*>(s->data);
      v.resize(E * in * rows);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < in; ++i) {
            const int64_t g = (e * rows + r) * (in / 32) + i / 32;
            const uint8_t byte = blocks[g * 16 + (i % 32) / 2];
            const uint8_t nibble = i % 2 == 0 ? byte & 15 : byte >> 4;
            v[(e * in + i) * rows + r] =
                RefFp4(nibble) * std::ldexp(1.f, static_cast<int>(scales[g]) - 127);
          }
      continue;
    }
    auto t = st.Get(spec.name, spec.shape);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t->dtype != model::TensorDtype::kF8E4M3) {
      v = FloatTensor(*t);
      continue;
    }
    const int64_t rows = spec.shape[0], cols = spec.shape[1], tiles = (cols + 127) / 128;
    auto s = st.Get(spec.name + "_scale_inv");
    EXPECT_TRUE(s.ok()) << spec.name;
    const std::vector<float> scale = FloatTensor(*s);
    const auto* codes = static_cast<const uint8_t*>(t->data);
    v.resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[r * cols + c] = RefE4m3(codes[r * cols + c]) * scale[(r / 128) * tiles + c / 128];
  }
  return out;
}

// Bytes the backend should hold: quantized codes and their scales as
// stored, the bf16 embedding and LM head as bf16, every other tensor fp32.
uint64_t ExpectedBytes(const model::Safetensors& st) {
  uint64_t n = 0;
  for (const std::string& name : st.Names()) {
    auto t = st.Get(name);
    const bool stored = t->dtype == model::TensorDtype::kF8E4M3 ||
                        t->dtype == model::TensorDtype::kU8 || name.ends_with("_scale_inv");
    if (stored) {
      n += t->nbytes;
    } else if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      n += t->numel() * 2;
    } else {
      n += t->numel() * 4;
    }
  }
  return n;
}

void ExpectMatchesDequantized(const fs::path& dir) {
  auto config = model::ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->quant.quantized());
  auto weights = model::SafetensorsWeights::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
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
  EXPECT_EQ((*quant)->weight_bytes(), ExpectedBytes(weights->safetensors()));
  EXPECT_LT((*quant)->weight_bytes(), (*ref)->weight_bytes());
}

class CpuMoeQuantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kTokenizers / "qwen3" / "tokenizer.json"))
      GTEST_SKIP() << "qwen3 tokenizer not set up (scripts/setup.sh)";
    dir_ = fs::path(::testing::TempDir()) /
           ("cpu_moe_quant_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  model::SynthOptions GptOss() const {
    model::SynthOptions o;
    o.arch = "gpt_oss";
    o.tokenizer_dir = kTokenizers / "qwen3";
    o.out_dir = dir_;
    o.layers = 2;  // one sliding, one full
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 16;
    o.intermediate = 96;  // the experts': 3 blocks of 32 into down_proj
    o.experts = 5;
    o.experts_per_token = 2;
    o.sliding_window = 8;
    o.lm_head_std = 0.5;
    o.seed = 11;
    o.quant = model::SynthQuant::kMxfp4;
    return o;
  }

  fs::path dir_;
};

TEST_F(CpuMoeQuantTest, GptOssMxfp4LogitsEqualTheDequantizedModel) {
  model::SynthOptions o = GptOss();
  Status st = model::SynthesizeModel(o);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto w = model::SafetensorsWeights::Open(dir_);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->IsQuantized("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(w->IsQuantized("model.layers.1.mlp.experts.down_proj"));
  EXPECT_FALSE(w->Has("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(w->IsQuantized("model.layers.0.self_attn.q_proj.weight"));
  ExpectMatchesDequantized(dir_);
}

TEST_F(CpuMoeQuantTest, Qwen3MoeFp8LogitsEqualTheDequantizedModel) {
  model::SynthOptions o;
  o.arch = "qwen3_moe";
  o.tokenizer_dir = kTokenizers / "qwen3";
  o.out_dir = dir_;
  o.layers = 2;
  o.hidden = 160;  // two 128-wide tiles, the second ragged
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 32;
  o.experts = 4;
  o.experts_per_token = 2;
  o.moe_intermediate = 136;  // ragged both ways
  o.seed = 12;
  o.lm_head_std = 0.5;
  o.quant = model::SynthQuant::kFp8;
  ASSERT_TRUE(model::SynthesizeModel(o).ok());
  auto w = model::SafetensorsWeights::Open(dir_);
  ASSERT_TRUE(w.ok());
  for (const char* part : {"gate_proj", "up_proj", "down_proj"})
    EXPECT_TRUE(w->IsQuantized(std::string("model.layers.1.mlp.experts.3.") + part + ".weight"))
        << part;
  EXPECT_TRUE(w->IsQuantized("model.layers.0.self_attn.o_proj.weight"));
  // The router stays float.
  EXPECT_FALSE(w->IsQuantized("model.layers.0.mlp.gate.weight"));
  EXPECT_EQ(w->safetensors().Get("model.layers.0.mlp.gate.weight")->dtype,
            model::TensorDtype::kBF16);
  ExpectMatchesDequantized(dir_);
}

// MXFP4 blocks under a config that does not say so (its quantization_config
// lost) fail to load, naming the tensor.
TEST_F(CpuMoeQuantTest, Mxfp4BlocksWithoutAQuantizationConfig) {
  ASSERT_TRUE(model::SynthesizeModel(GptOss()).ok());
  auto config = model::ModelConfig::Load(dir_);
  ASSERT_TRUE(config.ok());
  config->quant = model::QuantConfig{};
  auto w = model::SafetensorsWeights::Open(dir_);
  ASSERT_TRUE(w.ok());
  auto b = CpuBackend::Create(*config, *w, CpuBackendOptions{1, cache::KvDtype::kF32});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("gate_up_proj_blocks"));
}

// A scales tensor of the wrong shape is an error naming it.
TEST_F(CpuMoeQuantTest, Mxfp4ScalesOfTheWrongShape) {
  ASSERT_TRUE(model::SynthesizeModel(GptOss()).ok());
  auto config = model::ModelConfig::Load(dir_);
  ASSERT_TRUE(config.ok());
  auto st = model::Safetensors::Open(dir_);
  ASSERT_TRUE(st.ok());
  std::vector<model::SafetensorsWriter::Tensor> tensors;
  for (const std::string& name : st->Names()) {
    auto t = st->Get(name);
    model::SafetensorsWriter::Tensor x{name, t->dtype, t->shape, {}};
    x.bytes.assign(static_cast<const char*>(t->data), t->nbytes);
    if (name == "model.layers.1.mlp.experts.down_proj_scales") {
      x.shape = {5, 32, 6};  // [E, H, I/32] is [5, 64, 3]
    }
    tensors.push_back(std::move(x));
  }
  const fs::path bad = dir_ / "bad";
  fs::create_directories(bad);
  ASSERT_TRUE(model::SafetensorsWriter::WriteFile(bad / "model.safetensors", tensors).ok());
  auto w = model::SafetensorsWeights::Open(bad);
  ASSERT_TRUE(w.ok());
  auto b = CpuBackend::Create(*config, *w, CpuBackendOptions{1, cache::KvDtype::kF32});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("down_proj_scales"));
}

}  // namespace
}  // namespace agentkv::backend::cpu
