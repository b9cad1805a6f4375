#include "engine/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// Shaped like meta-llama/Llama-3.2-1B-Instruct's config.json.
json LlamaClassic() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "hidden_act": "silu", "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
}

// Gemma 3 1B-style text config (top-level convention).
json GemmaClassic() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": null,
    "sliding_window": 512, "sliding_window_pattern": 6,
    "final_logit_softcapping": null, "attn_logit_softcapping": null,
    "bos_token_id": 2, "eos_token_id": [1, 106], "torch_dtype": "bfloat16"})");
}

Result<ModelConfig> Parse(const json& j) { return ModelConfig::FromJsonText(j.dump(), "cfg.json"); }

class ModelConfigDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("model_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

TEST(ModelConfigTest, LlamaWithLlama3RopeScaling) {
  auto c = Parse(LlamaClassic());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->arch_name, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->num_layers, 16);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->activation, Activation::kSilu);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->rope.type, "llama3");
  EXPECT_FLOAT_EQ(c->rope.theta, 500000.0f);
  EXPECT_FLOAT_EQ(c->rope.factor, 32.0f);
  EXPECT_FLOAT_EQ(c->rope.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope.high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope.original_max_position, 8192);
  EXPECT_EQ(c->rope_local, c->rope);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  ASSERT_EQ(c->layer_kinds.size(), 16u);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(c->layer_kinds[l], cache::AttentionKind::kFull);
    EXPECT_EQ(c->layer_windows[l], 0);
  }
  EXPECT_FLOAT_EQ(c->AttentionScale(), 0.125f);
  cache::ModelCacheSpec spec = c->CacheSpec(cache::KvDtype::kBF16);
  EXPECT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.BytesPerTokenPerLayer(), 2u * 8 * 64 * 2);
}

TEST(ModelConfigTest, HeadDimDefaultsToHiddenOverHeads) {
  json j = LlamaClassic();
  j.erase("head_dim");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->head_dim, 64);
  j["head_dim"] = nullptr;
  EXPECT_EQ(Parse(j)->head_dim, 64);
}

TEST(ModelConfigTest, RopeParametersConventionLoadsEqual) {
  json t5 = LlamaClassic();
  t5.erase("rope_theta");
  t5.erase("rope_scaling");
  t5["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"},
                           {"factor", 32.0},         {"high_freq_factor", 4.0},
                           {"low_freq_factor", 1.0}, {"original_max_position_embeddings", 8192}};
  t5.erase("torch_dtype");
  t5["dtype"] = "bfloat16";
  auto a = Parse(LlamaClassic());
  auto b = Parse(t5);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  EXPECT_EQ(*a, *b);
}

TEST(ModelConfigTest, LinearAndDefaultRope) {
  json j = LlamaClassic();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope.type, "linear");
  EXPECT_FLOAT_EQ(c->rope.factor, 4.0f);

  j["rope_scaling"] = nullptr;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope.type, "default");
  EXPECT_FLOAT_EQ(c->rope.factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope.theta, 500000.0f);
}

TEST(ModelConfigTest, UnsupportedRopeTypeNamesField) {
  json j = LlamaClassic();
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("rope_scaling.rope_type"));
  EXPECT_THAT(c.status().message(), HasSubstr("longrope"));
}

TEST(ModelConfigTest, Llama3RopeMissingFactorNamesField) {
  json j = LlamaClassic();
  j["rope_scaling"].erase("low_freq_factor");
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("rope_scaling.low_freq_factor"));
}

TEST(ModelConfigTest, Qwen2HasBiasAndSlidingOnlyWhenEnabled) {
  json j = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21,
    "tie_word_embeddings": true, "eos_token_id": 151643, "bos_token_id": 151643})");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 64);
  for (auto k : c->layer_kinds) EXPECT_EQ(k, cache::AttentionKind::kFull);

  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  for (int l = 0; l < 24; ++l) {
    EXPECT_EQ(c->layer_kinds[l],
              l >= 21 ? cache::AttentionKind::kSliding : cache::AttentionKind::kFull)
        << l;
    EXPECT_EQ(c->layer_windows[l], l >= 21 ? 4096 : 0);
  }
  EXPECT_EQ(c->CacheSpec(cache::KvDtype::kF32).groups.size(), 2u);

  j["sliding_window"] = nullptr;
  c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("sliding_window"));
}

TEST(ModelConfigTest, Qwen3QkNormAndExplicitHeadDim) {
  json j = json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000,
    "rope_scaling": null, "attention_bias": false, "use_sliding_window": false,
    "sliding_window": null, "tie_word_embeddings": true,
    "bos_token_id": 151643, "eos_token_id": 151645})");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);  // not hidden / heads (64)
  EXPECT_FLOAT_EQ(c->rope.theta, 1e6f);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));

  json t5 = j;
  t5.erase("rope_theta");
  t5.erase("rope_scaling");
  t5["rope_parameters"] = {{"rope_theta", 1000000}, {"rope_type", "default"}};
  auto b = Parse(t5);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*c, *b);
}

TEST(ModelConfigTest, MistralSlidingWindowNullOrInt) {
  json j = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "vocab_size": 32768, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false})");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->tie_word_embeddings);
  for (auto k : c->layer_kinds) EXPECT_EQ(k, cache::AttentionKind::kFull);
  j["sliding_window"] = 4096;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(c->layer_kinds[l], cache::AttentionKind::kSliding);
    EXPECT_EQ(c->layer_windows[l], 4096);
  }
  cache::ModelCacheSpec spec = c->CacheSpec(cache::KvDtype::kF16);
  ASSERT_EQ(spec.groups.size(), 1u);
  EXPECT_EQ(spec.groups[0].kind, cache::AttentionKind::kSliding);
  EXPECT_EQ(spec.groups[0].window, 4096);
  EXPECT_EQ(spec.RingBlocks(0, 16), 4096 / 16 + 1);
}

TEST(ModelConfigTest, Gemma3TextConfig) {
  auto c = Parse(GemmaClassic());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kGemma3);
  EXPECT_EQ(c->model_type, "gemma3_text");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->gemma_norm);
  EXPECT_TRUE(c->sandwich_norm);
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma's default
  EXPECT_EQ(c->activation, Activation::kGeluTanh);
  EXPECT_FLOAT_EQ(c->embed_scale, std::sqrt(1152.0f));
  EXPECT_FLOAT_EQ(c->query_scale, 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 16.0f);
  EXPECT_EQ(c->final_logit_softcap, 0.0f);
  EXPECT_EQ(c->attn_logit_softcap, 0.0f);
  EXPECT_FLOAT_EQ(c->rope.theta, 1e6f);
  EXPECT_FLOAT_EQ(c->rope_local.theta, 1e4f);
  EXPECT_EQ(c->rope_local.type, "default");
  for (int l = 0; l < 26; ++l) {
    bool full = (l + 1) % 6 == 0;  // layers 5, 11, 17, 23
    EXPECT_EQ(c->layer_kinds[l],
              full ? cache::AttentionKind::kFull : cache::AttentionKind::kSliding)
        << l;
    EXPECT_EQ(c->layer_windows[l], full ? 0 : 512) << l;
  }
  cache::ModelCacheSpec spec = c->CacheSpec(cache::KvDtype::kBF16);
  ASSERT_EQ(spec.groups.size(), 2u);
  EXPECT_EQ(spec.groups[0].kind, cache::AttentionKind::kSliding);
  EXPECT_EQ(spec.groups[0].layers.size(), 22u);
  EXPECT_THAT(spec.groups[1].layers, ElementsAre(5, 11, 17, 23));
}

TEST(ModelConfigTest, Gemma3SoftcapsAndPatternDefault) {
  json j = GemmaClassic();
  j.erase("sliding_window_pattern");
  j["final_logit_softcapping"] = 30.0;
  j["attn_logit_softcapping"] = 50.0;
  j.erase("tie_word_embeddings");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_FLOAT_EQ(c->final_logit_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c->attn_logit_softcap, 50.0f);
  EXPECT_EQ(c->layer_kinds[5], cache::AttentionKind::kFull);
  EXPECT_EQ(c->layer_kinds[4], cache::AttentionKind::kSliding);
}

TEST(ModelConfigTest, Gemma3LayerTypesAndPerTypeRopeParametersLoadEqual) {
  json classic = GemmaClassic();
  classic["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  json t5 = classic;
  t5.erase("sliding_window_pattern");
  std::vector<std::string> types;
  for (int l = 0; l < 26; ++l)
    types.push_back((l + 1) % 6 == 0 ? "full_attention" : "sliding_attention");
  t5["layer_types"] = types;
  t5.erase("rope_theta");
  t5.erase("rope_scaling");
  t5.erase("rope_local_base_freq");
  t5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  auto a = Parse(classic);
  auto b = Parse(t5);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  EXPECT_EQ(a->rope.type, "linear");  // global layers only
  EXPECT_EQ(a->rope_local.type, "default");
  EXPECT_EQ(*a, *b);
}

TEST(ModelConfigTest, ArchitectureFromModelTypeWhenListMissing) {
  json j = GemmaClassic();
  j.erase("architectures");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch_name, "Gemma3ForCausalLM");
}

TEST(ModelConfigTest, UnknownArchitectureNamesFileAndField) {
  json j = LlamaClassic();
  j["architectures"] = {"FalconForCausalLM"};
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("architectures"));
  EXPECT_THAT(c.status().message(), HasSubstr("FalconForCausalLM"));

  j.erase("architectures");
  j["model_type"] = "falcon";
  c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("architectures"));
}

TEST(ModelConfigTest, MissingRequiredFieldNamesFileAndField) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings"}) {
    json j = LlamaClassic();
    j.erase(field);
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
    EXPECT_THAT(c.status().message(), HasSubstr(std::string("missing required field ") + field));
  }
}

TEST(ModelConfigTest, MistypedFieldsNameTheField) {
  struct Case {
    const char* field;
    json value;
  };
  for (const Case& k : {Case{"hidden_size", "2048"}, Case{"num_key_value_heads", 2.5},
                        Case{"rms_norm_eps", "small"}, Case{"tie_word_embeddings", 1},
                        Case{"architectures", "LlamaForCausalLM"}, Case{"eos_token_id", "x"},
                        Case{"rope_scaling", 3}, Case{"hidden_act", 7}}) {
    json j = LlamaClassic();
    j[k.field] = k.value;
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << k.field;
    EXPECT_THAT(c.status().message(), HasSubstr(k.field)) << c.status().message();
    EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
  }
}

TEST(ModelConfigTest, InconsistentValuesAreRejected) {
  json j = LlamaClassic();
  j["num_key_value_heads"] = 5;  // does not divide 32
  EXPECT_THAT(Parse(j).status().message(), HasSubstr("num_key_value_heads"));
  j = LlamaClassic();
  j["hidden_size"] = 0;
  EXPECT_THAT(Parse(j).status().message(), HasSubstr("hidden_size must be > 0"));
  j = LlamaClassic();
  j["hidden_act"] = "relu";
  EXPECT_THAT(Parse(j).status().message(), HasSubstr("relu"));
  j = GemmaClassic();
  j["layer_types"] = {"full_attention"};
  EXPECT_THAT(Parse(j).status().message(), HasSubstr("layer_types"));
  j = GemmaClassic();
  j["query_pre_attn_scalar"] = 0;
  EXPECT_THAT(Parse(j).status().message(), HasSubstr("query_pre_attn_scalar"));
  EXPECT_THAT(ModelConfig::FromJsonText("{not json", "x.json").status().message(),
              HasSubstr("x.json: not valid JSON"));
  EXPECT_FALSE(ModelConfig::FromJsonText("[1]", "x.json").ok());
}

TEST_F(ModelConfigDirTest, LoadMergesGenerationConfig) {
  json j = LlamaClassic();
  j["eos_token_id"] = 128009;
  j["bos_token_id"] = nullptr;
  Write("config.json", j.dump(2));
  Write("generation_config.json",
        R"({"bos_token_id": 128000, "eos_token_id": [128001, 128009], "do_sample": true})");
  auto c = ModelConfig::Load(dir_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128009, 128001));
  EXPECT_EQ(c->bos_token_id, 128000);
}

TEST_F(ModelConfigDirTest, LoadWithoutGenerationConfig) {
  Write("config.json", LlamaClassic().dump());
  auto c = ModelConfig::Load(dir_);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->eos_token_ids.size(), 3u);
}

TEST_F(ModelConfigDirTest, MissingConfigNamesFile) {
  auto c = ModelConfig::Load(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr((dir_ / "config.json").string()));
}

TEST_F(ModelConfigDirTest, ErrorsNameTheRealPath) {
  json j = LlamaClassic();
  j.erase("vocab_size");
  Write("config.json", j.dump());
  auto c = ModelConfig::Load(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr((dir_ / "config.json").string()));
  EXPECT_THAT(c.status().message(), HasSubstr("vocab_size"));
}

TEST_F(ModelConfigDirTest, BadGenerationConfigNamesFile) {
  Write("config.json", LlamaClassic().dump());
  Write("generation_config.json", "{oops");
  auto c = ModelConfig::Load(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("generation_config.json"));
  Write("generation_config.json", R"({"eos_token_id": "eos"})");
  c = ModelConfig::Load(dir_);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("generation_config.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("eos_token_id"));
}

}  // namespace
}  // namespace agentkv::model
