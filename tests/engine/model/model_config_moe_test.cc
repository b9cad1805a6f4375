// ModelConfig for the mixture-of-experts architectures (GPT-OSS, Qwen3-MoE),
// on configs shaped like the released ones and like transformers 5 writes
// them, and the ModelCacheSpec derived from them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/model/model_config.h"

namespace agentkv::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::vector<std::string> AlternatingTypes(int layers) {
  std::vector<std::string> t;
  for (int i = 0; i < layers; ++i) t.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return t;
}

// Shaped like openai/gpt-oss-20b's config.json (quantization_config left
// out: the quantized formats are read elsewhere).
json GptOss20b() {
  json j = json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
    "attention_bias": true, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "output_router_logits": false, "pad_token_id": 199999, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": false, "use_cache": true,
    "vocab_size": 201088})");
  j["layer_types"] = AlternatingTypes(24);
  return j;
}

// openai/gpt-oss-120b: 36 layers, 128 experts, otherwise as 20b.
json GptOss120b() {
  json j = GptOss20b();
  j["num_hidden_layers"] = 36;
  j["num_local_experts"] = 128;
  j["layer_types"] = AlternatingTypes(36);
  return j;
}

// gpt-oss-20b as transformers 5 writes it: rope_parameters with rope_theta
// inside, dtype instead of torch_dtype.
json GptOss20bV5() {
  json j = GptOss20b();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"beta_fast", 32.0},      {"beta_slow", 1.0},
                          {"factor", 32.0},         {"original_max_position_embeddings", 4096},
                          {"rope_theta", 150000.0}, {"rope_type", "yarn"},
                          {"truncate", false}};
  j["dtype"] = "bfloat16";
  return j;
}

// Shaped like Qwen/Qwen3-30B-A3B's config.json.
json Qwen3Moe30b() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

Result<ModelConfig> Parse(const json& j) { return ModelConfig::FromJsonText(j.dump(), "cfg.json"); }

TEST(ModelConfigMoeTest, GptOss20b) {
  auto c = Parse(GptOss20b());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kGptOss);
  EXPECT_EQ(c->num_layers, 24);
  EXPECT_EQ(c->hidden_size, 2880);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_heads, 64);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->vocab_size, 201088);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->o_proj_bias);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->moe.num_experts, 32);
  EXPECT_EQ(c->moe.experts_per_token, 4);
  EXPECT_EQ(c->moe.expert_intermediate, 2880);
  EXPECT_EQ(c->moe.routing, MoeRouting::kTopKThenSoftmax);
  EXPECT_TRUE(c->moe.router_bias);
  EXPECT_TRUE(c->moe.expert_bias);
  EXPECT_FLOAT_EQ(c->moe.swiglu_limit, 7.0f);
  for (int l = 0; l < 24; ++l) {
    EXPECT_TRUE(c->IsMoeLayer(l)) << l;
    EXPECT_EQ(c->layer_kinds[l],
              l % 2 == 0 ? cache::AttentionKind::kSliding : cache::AttentionKind::kFull);
    EXPECT_EQ(c->layer_windows[l], l % 2 == 0 ? 128 : 0);
  }
  EXPECT_EQ(c->rope.type, "yarn");
  EXPECT_FLOAT_EQ(c->rope.theta, 150000.f);
  EXPECT_FLOAT_EQ(c->rope.factor, 32.f);
  EXPECT_FLOAT_EQ(c->rope.beta_fast, 32.f);
  EXPECT_FLOAT_EQ(c->rope.beta_slow, 1.f);
  EXPECT_EQ(c->rope.original_max_position, 4096);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_EQ(c->rope_local, c->rope);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(200002));
}

TEST(ModelConfigMoeTest, GptOssCacheSpecHasSlidingAndFullGroups) {
  auto c = Parse(GptOss20b());
  ASSERT_TRUE(c.ok());
  const cache::ModelCacheSpec s = c->CacheSpec(cache::KvDtype::kBF16);
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].kind, cache::AttentionKind::kSliding);  // layer 0 slides
  EXPECT_EQ(s.groups[0].window, 128);
  EXPECT_EQ(s.groups[1].kind, cache::AttentionKind::kFull);
  ASSERT_EQ(s.groups[0].layers.size(), 12u);
  ASSERT_EQ(s.groups[1].layers.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(s.groups[0].layers[i], 2 * i);
    EXPECT_EQ(s.groups[1].layers[i], 2 * i + 1);
  }
  // 8 KV heads x 64 dims x K and V x 2 bytes.
  EXPECT_EQ(s.BytesPerTokenPerLayer(), 2048u);
  // Sliding layers hold at most ceil(window / block_size) + 1 blocks.
  for (int bs : {16, 32, 100}) {
    const int cap = (128 + bs - 1) / bs + 1;
    EXPECT_EQ(s.RingBlocks(0, bs), cap) << bs;
    EXPECT_EQ(s.BlocksFor(0, 100000, bs), cap) << bs;
    EXPECT_EQ(s.RingBlocks(1, bs), 0);
    EXPECT_EQ(s.BlocksFor(1, 100000, bs), (100000 + bs - 1) / bs);
  }
}

TEST(ModelConfigMoeTest, GptOss120b) {
  auto c = Parse(GptOss120b());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_layers, 36);
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.experts_per_token, 4);
  const cache::ModelCacheSpec s = c->CacheSpec(cache::KvDtype::kBF16);
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].layers.size(), 18u);
  EXPECT_EQ(s.groups[1].layers.size(), 18u);
}

TEST(ModelConfigMoeTest, GptOssBothRopeConventionsLoadTheSameModel) {
  auto a = Parse(GptOss20b());
  auto b = Parse(GptOss20bV5());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->rope, b->rope);
  EXPECT_EQ(b->torch_dtype, "bfloat16");
  ModelConfig bb = *b;
  bb.torch_dtype = a->torch_dtype;
  EXPECT_EQ(*a, bb);
}

TEST(ModelConfigMoeTest, GptOssDefaultsWithoutOptionalFields) {
  json j = GptOss20b();
  for (const char* k :
       {"layer_types", "sliding_window", "rope_scaling", "rope_theta", "swiglu_limit",
        "experts_per_token", "num_experts_per_tok", "attention_bias"})
    j.erase(k);
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // GptOssConfig's defaults.
  EXPECT_EQ(c->layer_kinds[0], cache::AttentionKind::kSliding);
  EXPECT_EQ(c->layer_kinds[1], cache::AttentionKind::kFull);
  EXPECT_EQ(c->layer_windows[0], 128);
  EXPECT_EQ(c->rope.type, "yarn");
  EXPECT_FLOAT_EQ(c->rope.theta, 150000.f);
  EXPECT_FLOAT_EQ(c->rope.factor, 32.f);
  EXPECT_FALSE(c->rope.truncate);
  EXPECT_EQ(c->moe.experts_per_token, 4);
  EXPECT_FLOAT_EQ(c->moe.swiglu_limit, 7.f);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->o_proj_bias);
}

TEST(ModelConfigMoeTest, YarnFactorAndOriginalContextDefaultFromMaxPosition) {
  json j = GptOss20b();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 8192}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FLOAT_EQ(c->rope.factor, 131072.f / 8192.f);
  EXPECT_TRUE(c->rope.truncate);  // transformers' default
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.25}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope.original_max_position, 131072);
  EXPECT_FLOAT_EQ(c->rope.factor, 4.f);
  EXPECT_FLOAT_EQ(c->rope.attention_factor, 1.25f);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", -1}};
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("rope_scaling.attention_factor"));
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", "x"}};
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("rope_scaling.beta_fast"));
}

TEST(ModelConfigMoeTest, Qwen3Moe30bA3b) {
  auto c = Parse(Qwen3Moe30b());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kQwen3Moe);
  EXPECT_EQ(c->num_layers, 48);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->o_proj_bias);
  EXPECT_FALSE(c->attention_sinks);
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.experts_per_token, 8);
  EXPECT_EQ(c->moe.expert_intermediate, 768);
  EXPECT_EQ(c->intermediate_size, 6144);
  EXPECT_EQ(c->moe.routing, MoeRouting::kSoftmaxThenTopK);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_FALSE(c->moe.router_bias);
  EXPECT_FALSE(c->moe.expert_bias);
  EXPECT_FLOAT_EQ(c->moe.swiglu_limit, 0.f);
  EXPECT_EQ(c->moe.decoder_sparse_step, 1);
  EXPECT_TRUE(c->moe.mlp_only_layers.empty());
  for (int l = 0; l < 48; ++l) EXPECT_TRUE(c->IsMoeLayer(l));
  EXPECT_EQ(c->rope.type, "default");
  EXPECT_FLOAT_EQ(c->rope.theta, 1e6f);
  const cache::ModelCacheSpec s = c->CacheSpec(cache::KvDtype::kBF16);
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].kind, cache::AttentionKind::kFull);
  EXPECT_EQ(s.groups[0].layers.size(), 48u);
}

TEST(ModelConfigMoeTest, Qwen3MoeExpertCountInEitherSpelling) {
  json j = Qwen3Moe30b();
  j.erase("num_experts");
  j["num_local_experts"] = 128;  // what transformers 5 writes
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->moe.num_experts, 128);
  j["num_experts"] = 128;  // both, agreeing
  EXPECT_TRUE(Parse(j).ok());
  j["num_experts"] = 64;  // both, disagreeing
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("disagrees with num_local_experts"));
  j.erase("num_experts");
  j.erase("num_local_experts");
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("num_local_experts"));
}

TEST(ModelConfigMoeTest, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  json j = Qwen3Moe30b();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<bool> moe;
  for (int l = 0; l < 6; ++l) moe.push_back(c->IsMoeLayer(l));
  // Sparse where (l + 1) % 2 == 0, except layer 3.
  EXPECT_THAT(moe, ElementsAre(false, true, false, false, false, true));
  EXPECT_THAT(c->moe.mlp_only_layers, ElementsAre(3));
}

TEST(ModelConfigMoeTest, Qwen3MoeRejectsBadFields) {
  struct Case {
    const char* key;
    json value;
    const char* message;
  };
  for (const Case& k : {Case{"num_experts_per_tok", 200, "num_experts_per_tok"},
                        Case{"num_experts_per_tok", 0, "num_experts_per_tok"},
                        Case{"num_experts", 0, "must be > 0"},
                        Case{"decoder_sparse_step", 0, "decoder_sparse_step"},
                        Case{"mlp_only_layers", json::array({48}), "mlp_only_layers"},
                        Case{"mlp_only_layers", 3, "mlp_only_layers"},
                        Case{"moe_intermediate_size", 0, "moe_intermediate_size"},
                        Case{"moe_intermediate_size", nullptr, "moe_intermediate_size"},
                        Case{"norm_topk_prob", "yes", "norm_topk_prob"}}) {
    json j = Qwen3Moe30b();
    j[k.key] = k.value;
    auto c = Parse(j);
    EXPECT_FALSE(c.ok()) << k.key;
    EXPECT_THAT(c.status().ToString(), HasSubstr(k.message)) << k.key;
    EXPECT_THAT(c.status().ToString(), HasSubstr("cfg.json")) << k.key;
  }
}

TEST(ModelConfigMoeTest, GptOssRejectsBadFields) {
  json j = GptOss20b();
  j["swiglu_limit"] = 0;
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("swiglu_limit"));
  j = GptOss20b();
  j["num_experts_per_tok"] = 33;
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("num_experts_per_tok"));
  j = GptOss20b();
  j.erase("num_local_experts");
  EXPECT_THAT(Parse(j).status().ToString(), HasSubstr("num_local_experts"));
}

TEST(ModelConfigMoeTest, ArchitectureFromModelType) {
  json j = GptOss20b();
  j.erase("architectures");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch_name, "GptOssForCausalLM");
  j = Qwen3Moe30b();
  j.erase("architectures");
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch_name, "Qwen3MoeForCausalLM");
}

TEST(ModelConfigMoeTest, DenseModelsHaveNoExperts) {
  json j = Qwen3Moe30b();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->IsMoe());
  EXPECT_FALSE(c->IsMoeLayer(0));
}

}  // namespace
}  // namespace agentkv::model
