// The Hugging Face tensor names and shapes a checkpoint of a ModelConfig must
// hold, and a check of a checkpoint against them. Shapes follow torch Linear:
// [out_features, in_features].
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "util/status.h"

namespace agentkv {

enum class WeightRole { kLinear, kEmbedding, kNorm, kBias };

struct WeightSpec {
  std::string name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  WeightRole role = WeightRole::kLinear;
};

// In file order of a typical checkpoint: embeddings, then per layer, then the
// final norm and (untied only) lm_head.
std::vector<WeightSpec> ExpectedWeights(const ModelConfig& config);

// OK if every expected tensor is present with its shape, in a dtype the
// engine supports, and (if given) in `dtype`. Errors name the file (or the
// checkpoint's files when missing) and the tensor. Extra tensors are ignored
// (some checkpoints carry lm_head.weight although tied, or rotary buffers).
Status ValidateWeights(const ModelConfig& config, const Safetensors& weights,
                       std::optional<TensorDtype> dtype = std::nullopt);

}  // namespace agentkv
