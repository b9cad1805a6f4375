// The Hugging Face tensor names and shapes a checkpoint of a ModelConfig must
// hold, and a check of a checkpoint against them. Shapes follow torch Linear:
// [out_features, in_features], except GPT-OSS's fused expert tensors, which
// transformers stores [experts, in, out] (see ExpectedWeights). The names
// are those a checkpoint stores: an MXFP4 checkpoint's experts are their
// `_blocks` / `_scales` tensors.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "util/status.h"

namespace agentkv::model {

// kExpert: a mixture-of-experts expert matrix (the tensors quantized
// checkpoints store quantized); kRouter: the router's weight (never
// quantized); kSink: attention sink logits, one per query head;
// kExpertBlocks / kExpertScales: an MXFP4 expert matrix's U8 codes and
// E8M0 scales.
enum class WeightRole {
  kLinear,
  kEmbedding,
  kNorm,
  kBias,
  kExpert,
  kRouter,
  kSink,
  kExpertBlocks,
  kExpertScales
};

struct WeightSpec {
  std::string name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  WeightRole role = WeightRole::kLinear;
};

// In file order of a typical checkpoint: embeddings, then per layer, then the
// final norm and (untied only) lm_head.
// GPT-OSS layers: q/k/v/o with biases, self_attn.sinks [heads],
// mlp.router.{weight [E, H], bias [E]}, mlp.experts.gate_up_proj [E, H, 2I]
// (gate and up interleaved along the last dimension: even columns gate, odd
// up), gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H];
// under quantization_config mxfp4 (unless modules_to_not_convert names the
// experts) the two expert matrices are MXFP4 in [out, in] order instead:
// gate_up_proj_blocks [E, 2I, H/32, 16] (gate and up rows interleaved),
// gate_up_proj_scales [E, 2I, H/32], down_proj_blocks [E, H, I/32, 16],
// down_proj_scales [E, H, I/32]; the biases stay float.
// Qwen3-MoE sparse layers: mlp.gate.weight [E, H] and per expert e
// mlp.experts.e.{gate,up}_proj.weight [I, H], down_proj.weight [H, I]; its
// dense layers (ModelConfig::IsMoeLayer false) have Qwen3's MLP.
std::vector<WeightSpec> ExpectedWeights(const ModelConfig& config);

// OK if every expected tensor is present with its shape, in a dtype the
// engine supports, and (if given) in `dtype`; MXFP4 blocks and scales must
// be U8, and under a quantized config a linear or expert weight may be
// F8_E4M3 whatever `dtype` says. Errors name the file (or the
// checkpoint's files when missing) and the tensor. Extra tensors are ignored
// (some checkpoints carry lm_head.weight although tied, or rotary buffers).
Status ValidateWeights(const ModelConfig& config, const Safetensors& weights,
                       std::optional<TensorDtype> dtype = std::nullopt);

}  // namespace agentkv::model
