#include "engine/model/weight_spec.h"

namespace agentkv::model {
namespace {

void AddExperts(const ModelConfig& c, const std::string& p, std::vector<WeightSpec>* w) {
  const int64_t h = c.hidden_size, e = c.moe.num_experts, i = c.moe.expert_intermediate;
  if (c.arch == Architecture::kGptOss) {
    w->push_back({p + "mlp.router.weight", {e, h}, WeightRole::kRouter});
    if (c.moe.router_bias) w->push_back({p + "mlp.router.bias", {e}, WeightRole::kBias});
    const bool mxfp4 = c.quant.method == QuantMethod::kMxfp4 && c.quant.Covers(p + "mlp.experts");
    // An MXFP4 matrix [E, out, in]: blocks of 32 inputs, 16 bytes each.
    auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
      if (!mxfp4) {
        w->push_back({name, {e, in, out}, WeightRole::kExpert});
        return;
      }
      const int64_t groups = in / kMxfp4Block;
      w->push_back(
          {name + "_blocks", {e, out, groups, kMxfp4Block / 2}, WeightRole::kExpertBlocks});
      w->push_back({name + "_scales", {e, out, groups}, WeightRole::kExpertScales});
    };
    matrix(p + "mlp.experts.gate_up_proj", 2 * i, h);
    if (c.moe.expert_bias)
      w->push_back({p + "mlp.experts.gate_up_proj_bias", {e, 2 * i}, WeightRole::kBias});
    matrix(p + "mlp.experts.down_proj", h, i);
    if (c.moe.expert_bias)
      w->push_back({p + "mlp.experts.down_proj_bias", {e, h}, WeightRole::kBias});
    return;
  }
  w->push_back({p + "mlp.gate.weight", {e, h}, WeightRole::kRouter});
  for (int64_t x = 0; x < e; ++x) {
    const std::string q = p + "mlp.experts." + std::to_string(x) + ".";
    w->push_back({q + "gate_proj.weight", {i, h}, WeightRole::kExpert});
    w->push_back({q + "up_proj.weight", {i, h}, WeightRole::kExpert});
    w->push_back({q + "down_proj.weight", {h, i}, WeightRole::kExpert});
  }
}

}  // namespace

std::vector<WeightSpec> ExpectedWeights(const ModelConfig& c) {
  const int64_t h = c.hidden_size, v = c.vocab_size, inter = c.intermediate_size;
  const int64_t q = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  std::vector<WeightSpec> w;
  w.push_back({"model.embed_tokens.weight", {v, h}, WeightRole::kEmbedding});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w.push_back({p + "input_layernorm.weight", {h}, WeightRole::kNorm});
    w.push_back({p + "self_attn.q_proj.weight", {q, h}, WeightRole::kLinear});
    w.push_back({p + "self_attn.k_proj.weight", {kv, h}, WeightRole::kLinear});
    w.push_back({p + "self_attn.v_proj.weight", {kv, h}, WeightRole::kLinear});
    if (c.attention_bias) {
      w.push_back({p + "self_attn.q_proj.bias", {q}, WeightRole::kBias});
      w.push_back({p + "self_attn.k_proj.bias", {kv}, WeightRole::kBias});
      w.push_back({p + "self_attn.v_proj.bias", {kv}, WeightRole::kBias});
    }
    w.push_back({p + "self_attn.o_proj.weight", {h, q}, WeightRole::kLinear});
    if (c.o_proj_bias) w.push_back({p + "self_attn.o_proj.bias", {h}, WeightRole::kBias});
    if (c.attention_sinks) w.push_back({p + "self_attn.sinks", {c.num_heads}, WeightRole::kSink});
    if (c.qk_norm) {
      w.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, WeightRole::kNorm});
      w.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, WeightRole::kNorm});
    }
    w.push_back({p + "post_attention_layernorm.weight", {h}, WeightRole::kNorm});
    if (c.sandwich_norm) {
      w.push_back({p + "pre_feedforward_layernorm.weight", {h}, WeightRole::kNorm});
      w.push_back({p + "post_feedforward_layernorm.weight", {h}, WeightRole::kNorm});
    }
    if (c.IsMoeLayer(i)) {
      AddExperts(c, p, &w);
      continue;
    }
    w.push_back({p + "mlp.gate_proj.weight", {inter, h}, WeightRole::kLinear});
    w.push_back({p + "mlp.up_proj.weight", {inter, h}, WeightRole::kLinear});
    w.push_back({p + "mlp.down_proj.weight", {h, inter}, WeightRole::kLinear});
  }
  w.push_back({"model.norm.weight", {h}, WeightRole::kNorm});
  if (!c.tie_word_embeddings) w.push_back({"lm_head.weight", {v, h}, WeightRole::kLinear});
  return w;
}

Status ValidateWeights(const ModelConfig& config, const Safetensors& weights,
                       std::optional<TensorDtype> dtype) {
  for (const WeightSpec& spec : ExpectedWeights(config)) {
    ASSIGN_OR_RETURN(TensorView t, weights.Get(spec.name, spec.shape));
    const bool codes =
        spec.role == WeightRole::kExpertBlocks || spec.role == WeightRole::kExpertScales;
    if (codes && t.dtype != TensorDtype::kU8)
      return InvalidArgument(weights.FileOf(spec.name).string() + ": tensor " + spec.name +
                             " has dtype " + std::string(TensorDtypeName(t.dtype)) +
                             ", expected U8 (MXFP4)");
    if (codes) continue;
    if (t.dtype == TensorDtype::kF8E4M3 && config.quant.quantized() &&
        (spec.role == WeightRole::kLinear || spec.role == WeightRole::kExpert))
      continue;
    if (dtype && t.dtype != *dtype)
      return InvalidArgument(weights.FileOf(spec.name).string() + ": tensor " + spec.name +
                             " has dtype " + std::string(TensorDtypeName(t.dtype)) + ", expected " +
                             std::string(TensorDtypeName(*dtype)));
  }
  return Status::Ok();
}

}  // namespace agentkv::model
