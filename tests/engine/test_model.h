// A small random model in memory for engine tests: configs of each
// architecture family and seeded random weights behind a WeightSource.
#pragma once

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/weight_source.h"
#include "engine/model/weight_spec.h"

namespace agentkv::testing {

class MapWeights : public model::WeightSource {
 public:
  std::map<std::string, std::vector<float>> t;
  bool Has(const std::string& name) const override { return t.count(name) > 0; }
  Result<std::vector<float>> LoadF32(const std::string& name,
                                     std::span<const int64_t> shape) const override {
    auto it = t.find(name);
    if (it == t.end()) return NotFound("no tensor " + name);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (n != static_cast<int64_t>(it->second.size())) return InvalidArgument("shape " + name);
    return it->second;
  }
};

inline model::ModelConfig SmallConfig(model::Architecture arch) {
  model::ModelConfig c;
  c.arch = arch;
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6f;
  c.rope.theta = 10000.f;
  c.layer_kinds.assign(c.num_layers, cache::AttentionKind::kFull);
  c.layer_windows.assign(c.num_layers, 0);
  if (arch == model::Architecture::kQwen3) c.qk_norm = true;
  if (arch == model::Architecture::kQwen2) c.attention_bias = true;
  if (arch == model::Architecture::kLlama) {
    c.rope.type = "llama3";
    c.rope.factor = 8.f;
    c.rope.original_max_position = 64;
  }
  if (arch == model::Architecture::kGemma3) {
    c.qk_norm = true;
    c.gemma_norm = true;
    c.sandwich_norm = true;
    c.embed_scale = std::sqrt(48.f);
    c.query_scale = 1.f / std::sqrt(24.f);
    c.activation = model::Activation::kGeluTanh;
    c.tie_word_embeddings = true;
    c.rope.theta = 1000000.f;
    c.rope_local.theta = 10000.f;
    c.layer_kinds = {cache::AttentionKind::kSliding, cache::AttentionKind::kSliding,
                     cache::AttentionKind::kFull};
    c.layer_windows = {7, 7, 0};
  }
  if (arch == model::Architecture::kGptOss) {
    // Sliding (window 7), full, sliding; attention biases and sinks; YaRN
    // with a ramp inside the 8 frequencies; 5 experts, 4 per token.
    c.intermediate_size = 24;
    c.attention_bias = true;
    c.o_proj_bias = true;
    c.attention_sinks = true;
    c.rope.theta = 150000.f;
    c.rope.type = "yarn";
    c.rope.factor = 32.f;
    c.rope.original_max_position = 4096;
    c.rope.truncate = false;
    c.rope_local = c.rope;
    c.layer_kinds = {cache::AttentionKind::kSliding, cache::AttentionKind::kFull,
                     cache::AttentionKind::kSliding};
    c.layer_windows = {7, 0, 7};
    c.moe.num_experts = 5;
    c.moe.experts_per_token = 4;
    c.moe.expert_intermediate = 24;
    c.moe.routing = model::MoeRouting::kTopKThenSoftmax;
    c.moe.router_bias = true;
    c.moe.expert_bias = true;
    c.moe.swiglu_limit = 7.f;
  }
  if (arch == model::Architecture::kQwen3Moe) {
    // 6 experts, 2 per token, renormalised; layer 1 dense.
    c.qk_norm = true;
    c.moe.num_experts = 6;
    c.moe.experts_per_token = 2;
    c.moe.expert_intermediate = 20;
    c.moe.routing = model::MoeRouting::kSoftmaxThenTopK;
    c.moe.norm_topk_prob = true;
    c.moe.mlp_only_layers = {1};
  }
  return c;
}

inline MapWeights RandomWeights(const model::ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.2f);
  MapWeights w;
  auto add = [&](const std::string& name, int64_t n, float base) {
    std::vector<float> v(n);
    for (auto& x : v) x = base + nd(rng);
    w.t[name] = v;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const float nb = c.gemma_norm ? 0.f : 1.f;
  add("model.embed_tokens.weight", c.vocab_size * H, 0.f);
  add("model.norm.weight", H, nb);
  if (!c.tie_word_embeddings) add("lm_head.weight", c.vocab_size * H, 0.f);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", H, nb);
    add(p + "post_attention_layernorm.weight", H, nb);
    add(p + "pre_feedforward_layernorm.weight", H, nb);
    add(p + "post_feedforward_layernorm.weight", H, nb);
    add(p + "self_attn.q_proj.weight", c.num_heads * D * H, 0.f);
    add(p + "self_attn.k_proj.weight", c.num_kv_heads * D * H, 0.f);
    add(p + "self_attn.v_proj.weight", c.num_kv_heads * D * H, 0.f);
    add(p + "self_attn.q_proj.bias", c.num_heads * D, 0.f);
    add(p + "self_attn.k_proj.bias", c.num_kv_heads * D, 0.f);
    add(p + "self_attn.v_proj.bias", c.num_kv_heads * D, 0.f);
    add(p + "self_attn.q_norm.weight", D, nb);
    add(p + "self_attn.k_norm.weight", D, nb);
    add(p + "self_attn.o_proj.weight", H * c.num_heads * D, 0.f);
    add(p + "mlp.gate_proj.weight", I * H, 0.f);
    add(p + "mlp.up_proj.weight", I * H, 0.f);
    add(p + "mlp.down_proj.weight", H * I, 0.f);
  }
  // Whatever else the architecture has (experts, routers, sinks, o_proj
  // biases), in ExpectedWeights' order.
  for (const model::WeightSpec& spec : model::ExpectedWeights(c)) {
    if (w.t.count(spec.name)) continue;
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    add(spec.name, n, spec.role == model::WeightRole::kNorm ? nb : 0.f);
  }
  return w;
}

}  // namespace agentkv::testing
