#include "engine/model/model_synth_quant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/model/model_config.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors.h"
#include "engine/model/safetensors_weights.h"
#include "quant_test_util.h"
#include "util/bf16.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::RefE4m3;
using json = nlohmann::json;

const fs::path kTokenizers = fs::path(AGENTKV_DATA_DIR) / "tokenizers";

class ModelSynthQuantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("synth_quant_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }
  SynthOptions Tiny(const std::string& name, SynthQuant q) {
    SynthOptions o;
    o.arch = "qwen3";
    o.tokenizer_dir = kTokenizers / "qwen3";
    o.out_dir = dir_ / name;
    o.layers = 1;
    o.hidden = 160;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 32;
    o.intermediate = 136;
    o.seed = 9;
    o.quant = q;
    return o;
  }
  bool HaveTokenizer() { return fs::exists(kTokenizers / "qwen3" / "tokenizer.json"); }
  fs::path dir_;
};

TEST(SynthQuantTest, Names) {
  EXPECT_EQ(*ParseSynthQuant(""), SynthQuant::kNone);
  EXPECT_EQ(*ParseSynthQuant("none"), SynthQuant::kNone);
  EXPECT_EQ(*ParseSynthQuant("fp8"), SynthQuant::kFp8);
  EXPECT_EQ(*ParseSynthQuant("fp8-channel"), SynthQuant::kFp8Channel);
  EXPECT_EQ(*ParseSynthQuant("mxfp4"), SynthQuant::kMxfp4);
  EXPECT_THAT(ParseSynthQuant("int4").status().message(), HasSubstr("--quant"));
  EXPECT_THAT(CheckSynthQuant(SynthQuant::kMxfp4, "qwen3").message(), HasSubstr("gpt_oss"));
  EXPECT_TRUE(CheckSynthQuant(SynthQuant::kMxfp4, "gpt_oss").ok());
  EXPECT_TRUE(CheckSynthQuant(SynthQuant::kFp8, "llama").ok());
}

TEST(SynthQuantTest, WhatIsQuantized) {
  QuantFormat f;
  const WeightSpec q{"model.layers.0.self_attn.q_proj.weight", {8, 8}, WeightRole::kLinear};
  EXPECT_TRUE(SynthQuantizes(SynthQuant::kFp8, q, &f));
  EXPECT_EQ(f, QuantFormat::kFp8Block);
  EXPECT_TRUE(SynthQuantizes(SynthQuant::kFp8Channel, q, &f));
  EXPECT_EQ(f, QuantFormat::kFp8Channel);
  EXPECT_FALSE(SynthQuantizes(SynthQuant::kNone, q, &f));
  EXPECT_FALSE(SynthQuantizes(SynthQuant::kMxfp4, q, &f));  // attention stays bf16
  EXPECT_FALSE(
      SynthQuantizes(SynthQuant::kFp8, {"lm_head.weight", {8, 8}, WeightRole::kLinear}, &f));
  EXPECT_FALSE(SynthQuantizes(SynthQuant::kFp8,
                              {"model.embed_tokens.weight", {8, 8}, WeightRole::kEmbedding}, &f));
  EXPECT_FALSE(SynthQuantizes(
      SynthQuant::kFp8, {"model.layers.0.input_layernorm.weight", {8}, WeightRole::kNorm}, &f));
  const WeightSpec ex{"model.layers.0.mlp.experts.gate_up_proj", {4, 64, 32}, WeightRole::kLinear};
  EXPECT_TRUE(SynthQuantizes(SynthQuant::kMxfp4, ex, &f));
  EXPECT_EQ(f, QuantFormat::kMxfp4);
  EXPECT_FALSE(SynthQuantizes(SynthQuant::kFp8, ex, &f));
}

TEST(SynthQuantTest, ConfigsParseAsPublishedOnesDo) {
  for (SynthQuant q : {SynthQuant::kFp8, SynthQuant::kFp8Channel, SynthQuant::kMxfp4}) {
    json root;
    root["quantization_config"] = json::parse(SynthQuantConfig(q).dump());
    auto c = ParseQuantConfig(root, "synth");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->quantized());
    // Qwen3-FP8 lists no modules; the others name the LM head.
    EXPECT_EQ(c->Covers("lm_head"), q == SynthQuant::kFp8);
  }
  EXPECT_EQ(SynthQuantConfig(SynthQuant::kFp8)["weight_block_size"],
            nlohmann::ordered_json({128, 128}));
  EXPECT_EQ(SynthQuantConfig(SynthQuant::kFp8)["fmt"], "e4m3");
  EXPECT_EQ(SynthQuantConfig(SynthQuant::kFp8Channel)["quant_method"], "compressed-tensors");
}

TEST_F(ModelSynthQuantTest, Mxfp4WriterForANamedSet) {
  // Two expert weights written as GPT-OSS stores them, read back through
  // the checkpoint reader.
  fs::create_directories(dir_);
  const std::vector<int64_t> a = {2, 40, 96}, b = {2, 96, 64};
  SafetensorsWriter w(dir_ / "experts.safetensors");
  ASSERT_TRUE(DeclareQuantized(w, "e.gate_up_proj", a, QuantFormat::kMxfp4).ok());
  ASSERT_TRUE(DeclareQuantized(w, "e.down_proj", b, QuantFormat::kMxfp4).ok());
  EXPECT_THAT(DeclareQuantized(w, "bad", {4, 40}, QuantFormat::kMxfp4).message(),
              HasSubstr("multiples of 32"));
  ASSERT_TRUE(w.Begin().ok());
  auto value = [](uint64_t i) { return std::sin(0.37 * static_cast<double>(i)) * 0.03; };
  SynthValues fill = [&](uint64_t first, uint64_t count, float* out) {
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<float>(value(first + i));
  };
  auto n1 = WriteQuantized(w, a, QuantFormat::kMxfp4, fill);
  ASSERT_TRUE(n1.ok());
  EXPECT_EQ(*n1, 2u * 40 * 96 / 2 + 2u * 40 * 3);
  ASSERT_TRUE(WriteQuantized(w, b, QuantFormat::kMxfp4, fill).ok());
  ASSERT_TRUE(w.Finish().ok());
  auto st = SafetensorsWeights::Open(dir_ / "experts.safetensors");
  ASSERT_TRUE(st.ok());
  QuantConfig qc;
  qc.method = QuantMethod::kMxfp4;
  qc.format = QuantFormat::kMxfp4;
  for (const auto& [name, shape] : {std::pair{"e.gate_up_proj", a}, {"e.down_proj", b}}) {
    auto q = st->LoadQuantized(name, shape, qc);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    const int64_t rows = shape[1], cols = shape[2];
    std::vector<float> out(rows * cols);
    for (int64_t e = 0; e < 2; ++e) {
      DequantizeRows(*q, e, 0, rows, out.data());
      for (int64_t i = 0; i < rows * cols; ++i) {
        const int64_t g = (e * rows * cols + i) / 32;
        const double step = std::ldexp(1.0, q->exponents[g] - 127);  // half the widest gap
        EXPECT_LE(std::fabs(out[i] - value(e * rows * cols + i)), step + 1e-9) << name << " " << i;
      }
    }
  }
}

TEST_F(ModelSynthQuantTest, Fp8CheckpointsHoldTheBf16ModelsValues) {
  if (!HaveTokenizer()) GTEST_SKIP() << "qwen3 tokenizer not set up";
  SynthOptions plain = Tiny("bf16", SynthQuant::kNone);
  ASSERT_TRUE(SynthesizeModel(plain).ok());
  auto ref = Safetensors::Open(plain.out_dir);
  ASSERT_TRUE(ref.ok());
  for (SynthQuant q : {SynthQuant::kFp8, SynthQuant::kFp8Channel}) {
    SynthOptions o = Tiny(q == SynthQuant::kFp8 ? "fp8" : "ch", q);
    ASSERT_TRUE(SynthesizeModel(o).ok());
    std::ifstream in(o.out_dir / "config.json");
    const json cfg = json::parse(in);
    ASSERT_TRUE(cfg.contains("quantization_config"));
    EXPECT_EQ(cfg["torch_dtype"], "bfloat16");  // of the unquantized tensors
    auto mc = ModelConfig::Load(o.out_dir);
    ASSERT_TRUE(mc.ok()) << mc.status().ToString();
    EXPECT_EQ(mc->quant.format,
              q == SynthQuant::kFp8 ? QuantFormat::kFp8Block : QuantFormat::kFp8Channel);
    auto st = Safetensors::Open(o.out_dir);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->Get("model.embed_tokens.weight")->dtype, TensorDtype::kBF16);
    EXPECT_EQ(st->Get("model.norm.weight")->dtype, TensorDtype::kBF16);
    const std::string name = "model.layers.0.mlp.down_proj.weight";  // [160, 136]
    auto t = st->Get(name, {160, 136});
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->dtype, TensorDtype::kF8E4M3);
    const std::string sname = name + (q == SynthQuant::kFp8 ? "_scale_inv" : "_scale");
    auto s = st->Get(
        sname, q == SynthQuant::kFp8 ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{160, 1});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto r = ref->Get(name);
    const auto* codes = static_cast<const uint8_t*>(t->data);
    const auto* sc = static_cast<const float*>(s->data);
    const auto* bf = static_cast<const uint16_t*>(r->data);
    for (int64_t row = 0; row < 160; ++row)
      for (int64_t c = 0; c < 136; ++c) {
        const float scale = q == SynthQuant::kFp8 ? sc[(row / 128) * 2 + c / 128] : sc[row];
        const float deq = RefE4m3(codes[row * 136 + c]) * scale;
        const float want = Bf16ToF32(bf[row * 136 + c]);
        // Both round the same draw: e4m3 within 1/16 relative (or the
        // subnormal step), bf16 within 1/256.
        EXPECT_LE(std::fabs(deq - want),
                  std::fabs(want) * (1.f / 16 + 1.f / 128) + scale * std::ldexp(1.f, -9))
            << row << " " << c;
      }
  }
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST_F(ModelSynthQuantTest, CliQuantFlag) {
  if (!HaveTokenizer()) GTEST_SKIP() << "qwen3 tokenizer not set up";
  if (!fs::exists(AGENTKV_BINARY)) GTEST_SKIP() << "agentkv binary not built";
  const std::string base = std::string(AGENTKV_BINARY) + " model synth --arch qwen3 --tokenizer " +
                           (kTokenizers / "qwen3").string() +
                           " --layers 1 --hidden 160 --heads 4 --kv-heads 2 --head-dim 32"
                           " --intermediate 136 --seed 9 --out ";
  const auto run = [](const std::string& cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str());
  };
  // The flag gives what the library gives.
  ASSERT_EQ(run(base + (dir_ / "cli").string() + " --quant fp8-channel"), 0);
  ASSERT_TRUE(SynthesizeModel(Tiny("lib", SynthQuant::kFp8Channel)).ok());
  for (const char* f : {"model.safetensors", "config.json"})
    EXPECT_EQ(ReadAll(dir_ / "cli" / f), ReadAll(dir_ / "lib" / f)) << f;
  EXPECT_NE(run(base + (dir_ / "bad").string() + " --quant int4"), 0);
  EXPECT_NE(run(base + (dir_ / "mx").string() + " --quant mxfp4"), 0);
  EXPECT_FALSE(fs::exists(dir_ / "mx" / "config.json"));
}

TEST_F(ModelSynthQuantTest, Mxfp4OnADenseArchIsAClearError) {
  if (!HaveTokenizer()) GTEST_SKIP() << "qwen3 tokenizer not set up";
  Status st = SynthesizeModel(Tiny("mx", SynthQuant::kMxfp4));
  EXPECT_THAT(st.message(), HasSubstr("--quant mxfp4"));
  EXPECT_FALSE(fs::exists(dir_ / "mx" / "config.json"));
}

}  // namespace
}  // namespace agentkv::model
