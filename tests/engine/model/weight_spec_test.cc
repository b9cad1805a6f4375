#include "engine/model/weight_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/model/safetensors_writer.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

ModelConfig Config(const std::string& arch, bool tie, json extra = json::object()) {
  json j = {{"architectures", {arch}},   {"vocab_size", 50},       {"hidden_size", 16},
            {"intermediate_size", 24},   {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2},  {"head_dim", 8},          {"max_position_embeddings", 64},
            {"tie_word_embeddings", tie}};
  j.update(extra);
  auto c = ModelConfig::FromJsonText(j.dump(), "config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

std::set<std::string> Names(const ModelConfig& c) {
  std::set<std::string> s;
  for (const auto& w : ExpectedWeights(c)) s.insert(w.name);
  return s;
}

TEST(WeightSpecTest, LlamaNamesAndShapes) {
  ModelConfig c = Config("LlamaForCausalLM", false);
  auto w = ExpectedWeights(c);
  // embed + 9 per layer + final norm + lm_head
  EXPECT_EQ(w.size(), 1u + 2 * 9 + 2);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& s : w) shapes[s.name] = s.shape;
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (std::vector<int64_t>{50, 16}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.o_proj.weight"), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(shapes.at("model.layers.0.post_attention_layernorm.weight"),
            (std::vector<int64_t>{16}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (std::vector<int64_t>{50, 16}));
  EXPECT_EQ(Names(Config("LlamaForCausalLM", true)).count("lm_head.weight"), 0u);
}

TEST(WeightSpecTest, ArchitectureExtras) {
  auto qwen2 = Names(Config("Qwen2ForCausalLM", true));
  EXPECT_TRUE(qwen2.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(qwen2.count("model.layers.1.self_attn.v_proj.bias"));
  EXPECT_FALSE(qwen2.count("model.layers.0.self_attn.o_proj.bias"));
  auto qwen3 = Names(Config("Qwen3ForCausalLM", true));
  EXPECT_TRUE(qwen3.count("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_TRUE(qwen3.count("model.layers.0.self_attn.k_norm.weight"));
  EXPECT_FALSE(qwen3.count("model.layers.0.self_attn.q_proj.bias"));
  auto gemma = Names(Config("Gemma3ForCausalLM", true));
  EXPECT_TRUE(gemma.count("model.layers.1.pre_feedforward_layernorm.weight"));
  EXPECT_TRUE(gemma.count("model.layers.1.post_feedforward_layernorm.weight"));
  EXPECT_TRUE(gemma.count("model.layers.1.self_attn.k_norm.weight"));
  auto llama = Names(Config("LlamaForCausalLM", true));
  EXPECT_FALSE(llama.count("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(llama.count("model.layers.0.pre_feedforward_layernorm.weight"));
}

std::map<std::string, WeightSpec> ByName(const ModelConfig& c) {
  std::map<std::string, WeightSpec> m;
  for (const auto& w : ExpectedWeights(c)) m[w.name] = w;
  return m;
}

TEST(WeightSpecTest, GptOssNamesShapesAndRoles) {
  ModelConfig c =
      Config("GptOssForCausalLM", false, {{"num_local_experts", 5}, {"num_experts_per_tok", 2}});
  const auto m = ByName(c);
  // embed + 17 per layer (norms 2, q/k/v/o weights and biases 8, sinks,
  // router weight and bias, 4 expert tensors) + final norm + lm_head.
  EXPECT_EQ(m.size(), 1u + 2 * 17 + 2);
  auto shape = [&](const std::string& n) { return m.at("model.layers.1." + n).shape; };
  auto role = [&](const std::string& n) { return m.at("model.layers.1." + n).role; };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("self_attn.q_proj.bias"), (S{32}));
  EXPECT_EQ(shape("self_attn.k_proj.bias"), (S{16}));
  EXPECT_EQ(shape("self_attn.o_proj.bias"), (S{16}));
  EXPECT_EQ(shape("self_attn.sinks"), (S{4}));
  EXPECT_EQ(role("self_attn.sinks"), WeightRole::kSink);
  EXPECT_EQ(shape("mlp.router.weight"), (S{5, 16}));
  EXPECT_EQ(role("mlp.router.weight"), WeightRole::kRouter);
  EXPECT_EQ(shape("mlp.router.bias"), (S{5}));
  EXPECT_EQ(shape("mlp.experts.gate_up_proj"), (S{5, 16, 48}));
  EXPECT_EQ(role("mlp.experts.gate_up_proj"), WeightRole::kExpert);
  EXPECT_EQ(shape("mlp.experts.gate_up_proj_bias"), (S{5, 48}));
  EXPECT_EQ(role("mlp.experts.gate_up_proj_bias"), WeightRole::kBias);
  EXPECT_EQ(shape("mlp.experts.down_proj"), (S{5, 24, 16}));
  EXPECT_EQ(role("mlp.experts.down_proj"), WeightRole::kExpert);
  EXPECT_EQ(shape("mlp.experts.down_proj_bias"), (S{5, 16}));
  EXPECT_EQ(m.count("model.layers.0.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_norm.weight"), 0u);
}

// Under quantization_config mxfp4 the expert matrices are named as the
// released checkpoints store them: [E, out, in/32, 16] blocks and [E, out,
// in/32] scales; biases and everything else as before. An expert module
// that modules_to_not_convert names keeps its float tensors.
TEST(WeightSpecTest, GptOssMxfp4ExpertsAreBlocksAndScales) {
  const json moe = {{"num_local_experts", 5},
                    {"num_experts_per_tok", 2},
                    {"hidden_size", 64},
                    {"intermediate_size", 96}};
  json mx = moe;
  mx["quantization_config"] = {{"quant_method", "mxfp4"},
                               {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}};
  const auto m = ByName(Config("GptOssForCausalLM", false, mx));
  EXPECT_EQ(m.size(), ByName(Config("GptOssForCausalLM", false, moe)).size() + 2 * 2);
  using S = std::vector<int64_t>;
  const std::string p = "model.layers.1.mlp.experts.";
  EXPECT_EQ(m.count(p + "gate_up_proj"), 0u);
  EXPECT_EQ(m.count(p + "down_proj"), 0u);
  EXPECT_EQ(m.at(p + "gate_up_proj_blocks").shape, (S{5, 192, 2, 16}));
  EXPECT_EQ(m.at(p + "gate_up_proj_blocks").role, WeightRole::kExpertBlocks);
  EXPECT_EQ(m.at(p + "gate_up_proj_scales").shape, (S{5, 192, 2}));
  EXPECT_EQ(m.at(p + "gate_up_proj_scales").role, WeightRole::kExpertScales);
  EXPECT_EQ(m.at(p + "down_proj_blocks").shape, (S{5, 64, 3, 16}));
  EXPECT_EQ(m.at(p + "down_proj_scales").shape, (S{5, 64, 3}));
  EXPECT_EQ(m.at(p + "gate_up_proj_bias").shape, (S{5, 192}));
  EXPECT_EQ(m.at(p + "down_proj_bias").shape, (S{5, 64}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.weight").role, WeightRole::kLinear);

  json skip = mx;
  skip["quantization_config"]["modules_to_not_convert"] = {"model.layers.1.mlp.experts"};
  const auto k = ByName(Config("GptOssForCausalLM", false, skip));
  EXPECT_EQ(k.count("model.layers.1.mlp.experts.gate_up_proj"), 1u);
  EXPECT_EQ(k.count("model.layers.0.mlp.experts.gate_up_proj_blocks"), 1u);
}

TEST(WeightSpecTest, Qwen3MoeNamesShapesAndDenseLayers) {
  ModelConfig c = Config("Qwen3MoeForCausalLM", false,
                         {{"num_experts", 3},
                          {"num_experts_per_tok", 2},
                          {"moe_intermediate_size", 12},
                          {"num_hidden_layers", 3},
                          {"mlp_only_layers", {1}}});
  const auto m = ByName(c);
  using S = std::vector<int64_t>;
  EXPECT_EQ(m.at("model.layers.0.mlp.gate.weight").shape, (S{3, 16}));
  EXPECT_EQ(m.at("model.layers.0.mlp.gate.weight").role, WeightRole::kRouter);
  for (int e = 0; e < 3; ++e) {
    const std::string p = "model.layers.2.mlp.experts." + std::to_string(e) + ".";
    EXPECT_EQ(m.at(p + "gate_proj.weight").shape, (S{12, 16}));
    EXPECT_EQ(m.at(p + "up_proj.weight").shape, (S{12, 16}));
    EXPECT_EQ(m.at(p + "down_proj.weight").shape, (S{16, 12}));
    EXPECT_EQ(m.at(p + "down_proj.weight").role, WeightRole::kExpert);
  }
  EXPECT_EQ(m.count("model.layers.0.mlp.experts.3.gate_proj.weight"), 0u);
  EXPECT_EQ(m.count("model.layers.0.mlp.router.bias"), 0u);
  // Layer 1 is dense (mlp_only_layers): Qwen3's MLP at intermediate_size.
  EXPECT_EQ(m.at("model.layers.1.mlp.gate_proj.weight").shape, (S{24, 16}));
  EXPECT_EQ(m.count("model.layers.1.mlp.gate.weight"), 0u);
  EXPECT_TRUE(m.count("model.layers.1.self_attn.q_norm.weight"));
  EXPECT_FALSE(m.count("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_FALSE(m.count("model.layers.1.self_attn.sinks"));
}

class ValidateWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("weight_spec_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the expected tensors of `c` (zeros), letting `edit` change them.
  fs::path Write(const ModelConfig& c,
                 const std::function<void(std::vector<SafetensorsWriter::Tensor>&)>& edit) {
    std::vector<SafetensorsWriter::Tensor> ts;
    for (const auto& w : ExpectedWeights(c)) {
      ts.push_back(
          {w.name, TensorDtype::kBF16, w.shape, std::string(NumElements(w.shape) * 2, '\0')});
    }
    edit(ts);
    fs::path p = dir_ / "model.safetensors";
    EXPECT_TRUE(SafetensorsWriter::WriteFile(p, ts).ok());
    return p;
  }
  fs::path dir_;
};

// MXFP4 blocks and scales must be U8; an F8_E4M3 linear weight passes a
// float dtype check when the config is quantized.
TEST_F(ValidateWeightsTest, QuantizedDtypes) {
  ModelConfig c =
      Config("GptOssForCausalLM", false,
             {{"num_local_experts", 2},
              {"num_experts_per_tok", 1},
              {"hidden_size", 32},
              {"intermediate_size", 32},
              {"quantization_config",
               {{"quant_method", "mxfp4"}, {"modules_to_not_convert", json::array()}}}});
  auto u8 = [&](bool blocks_u8) {
    return [=](std::vector<SafetensorsWriter::Tensor>& ts) {
      for (auto& t : ts) {
        if (!t.name.ends_with("_blocks") && !t.name.ends_with("_scales")) continue;
        if (!blocks_u8 && t.name.ends_with("down_proj_scales")) continue;
        t.dtype = TensorDtype::kU8;
        t.bytes.resize(t.bytes.size() / 2);
      }
    };
  };
  auto good = Safetensors::Open(Write(c, u8(true)));
  ASSERT_TRUE(good.ok());
  Status st = ValidateWeights(c, *good, TensorDtype::kBF16);
  EXPECT_TRUE(st.ok()) << st.ToString();
  fs::remove(dir_ / "model.safetensors");
  auto bad = Safetensors::Open(Write(c, u8(false)));
  ASSERT_TRUE(bad.ok());
  st = ValidateWeights(c, *bad);
  EXPECT_THAT(st.message(), HasSubstr("model.layers.0.mlp.experts.down_proj_scales"));
  EXPECT_THAT(st.message(), HasSubstr("U8"));

  ModelConfig fp8 = Config(
      "Qwen3ForCausalLM", false,
      {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}});
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  auto f8 = [&](std::vector<SafetensorsWriter::Tensor>& ts) {
    for (auto& t : ts)
      if (t.name == q) {
        t.dtype = TensorDtype::kF8E4M3;
        t.bytes.resize(t.bytes.size() / 2);
      }
  };
  fs::remove(dir_ / "model.safetensors");
  auto w = Safetensors::Open(Write(fp8, f8));
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(ValidateWeights(fp8, *w, TensorDtype::kBF16).ok());
  fp8.quant = QuantConfig{};  // without a quantization_config, F8 is not bf16
  EXPECT_THAT(ValidateWeights(fp8, *w, TensorDtype::kBF16).message(), HasSubstr(q));
}

TEST_F(ValidateWeightsTest, CompleteCheckpointPasses) {
  ModelConfig c = Config("Qwen3ForCausalLM", false);
  fs::path p = Write(c, [](auto&) {});
  auto st = Safetensors::Open(p);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(ValidateWeights(c, *st).ok());
  EXPECT_TRUE(ValidateWeights(c, *st, TensorDtype::kBF16).ok());
}

TEST_F(ValidateWeightsTest, ExtraTensorsAreIgnored) {
  ModelConfig c = Config("LlamaForCausalLM", true);
  fs::path p = Write(c, [](auto& ts) {
    ts.push_back({"lm_head.weight", TensorDtype::kBF16, {50, 16}, std::string(1600, '\0')});
  });
  EXPECT_TRUE(ValidateWeights(c, *Safetensors::Open(p)).ok());
}

TEST_F(ValidateWeightsTest, MissingTensorIsNamed) {
  ModelConfig c = Config("Qwen3ForCausalLM", true);
  fs::path p = Write(c, [](auto& ts) {
    std::erase_if(ts,
                  [](const auto& t) { return t.name == "model.layers.1.self_attn.k_norm.weight"; });
  });
  Status st = ValidateWeights(c, *Safetensors::Open(p));
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("model.layers.1.self_attn.k_norm.weight"));
  EXPECT_THAT(st.message(), HasSubstr(p.string()));
}

TEST_F(ValidateWeightsTest, WrongShapeIsNamed) {
  ModelConfig c = Config("LlamaForCausalLM", false);
  fs::path p = Write(c, [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {16, 24};  // transposed
  });
  Status st = ValidateWeights(c, *Safetensors::Open(p));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("model.layers.0.mlp.up_proj.weight"));
  EXPECT_THAT(st.message(), HasSubstr(p.string()));
  EXPECT_THAT(st.message(), HasSubstr("[24, 16]"));
}

TEST_F(ValidateWeightsTest, WrongDtypeIsNamed) {
  ModelConfig c = Config("LlamaForCausalLM", true);
  fs::path p = Write(c, [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") {
        t.dtype = TensorDtype::kF32;
        t.bytes.resize(t.bytes.size() * 2);
      }
  });
  auto w = Safetensors::Open(p);
  EXPECT_TRUE(ValidateWeights(c, *w).ok());  // any supported dtype
  Status st = ValidateWeights(c, *w, TensorDtype::kBF16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("model.norm.weight"));
  EXPECT_THAT(st.message(), HasSubstr(p.string()));
  EXPECT_THAT(st.message(), HasSubstr("F32"));
}

}  // namespace
}  // namespace agentkv::model
