// ModelConfig: what the forward pass needs from a Hugging Face config.json
// (and generation_config.json), for the architectures of SPEC section 2.
// Both conventions load to the same value: top-level rope_theta/rope_scaling
// and the transformers-5 `rope_parameters` object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/model_cache_spec.h"
#include "engine/model/quant_config.h"
#include "util/status.h"

namespace agentkv::model {

enum class Architecture { kLlama, kQwen2, kQwen3, kMistral, kGemma3, kGptOss, kQwen3Moe };

enum class Activation { kSilu, kGeluTanh };

// How a mixture-of-experts layer turns router logits into expert weights.
enum class MoeRouting {
  kTopKThenSoftmax,  // GPT-OSS: top k logits, softmax over those k
  kSoftmaxThenTopK,  // Qwen3-MoE: softmax over all, top k (renormalised if asked)
};

// The mixture-of-experts part of a config; num_experts 0 for dense models.
struct MoeSpec {
  int num_experts = 0;
  int experts_per_token = 0;
  int expert_intermediate = 0;  // per expert
  MoeRouting routing = MoeRouting::kSoftmaxThenTopK;
  bool router_bias = false;     // mlp.router.bias (GPT-OSS)
  bool expert_bias = false;     // gate_up_proj_bias / down_proj_bias (GPT-OSS)
  bool norm_topk_prob = false;  // kSoftmaxThenTopK: renormalise the k weights
  // > 0: GPT-OSS's clamped SwiGLU (gate <= limit, |up| <= limit,
  // (up + 1) * gate * sigmoid(1.702 gate)); 0: plain SwiGLU.
  float swiglu_limit = 0.0f;
  // Qwen3-MoE: layer L is sparse unless listed here or (L + 1) %
  // decoder_sparse_step != 0; dense layers use intermediate_size.
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;

  bool operator==(const MoeSpec&) const = default;
};

struct RopeSpec {
  float theta = 10000.0f;
  // "default", "linear" (factor), "llama3" (factor, low/high_freq_factor,
  // original_max_position_embeddings) or "yarn" (factor, beta_fast,
  // beta_slow, original_max_position_embeddings, truncate, attention_factor
  // or mscale/mscale_all_dim).
  std::string type = "default";
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
  // YaRN. attention_factor 0: derived from factor (and mscale /
  // mscale_all_dim when both are set), as transformers does.
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  bool truncate = true;
  float attention_factor = 0.0f;
  float mscale = 0.0f;
  float mscale_all_dim = 0.0f;

  bool operator==(const RopeSpec&) const = default;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;    // as in config.json "architectures"[0]
  std::string model_type;   // config.json "model_type", e.g. "qwen3", "gemma3_text"
  std::string torch_dtype;  // "torch_dtype" (or transformers-5 "dtype"); may be empty
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // config "head_dim", else hidden_size / num_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  Activation activation = Activation::kSilu;
  bool tie_word_embeddings = false;
  bool attention_bias = false;   // q/k/v projections carry a bias (Qwen2, GPT-OSS)
  bool o_proj_bias = false;      // o_proj carries a bias too (GPT-OSS)
  bool attention_sinks = false;  // per-head learned sink logit (GPT-OSS self_attn.sinks)
  bool qk_norm = false;          // per-head RMSNorm on q and k (Qwen3, Gemma 3)

  // Per-layer attention kind and window (tokens a query sees, itself
  // included); window 0 for full attention.
  std::vector<cache::AttentionKind> layer_kinds;
  std::vector<int> layer_windows;

  RopeSpec rope;        // full-attention layers (and all layers outside Gemma 3)
  RopeSpec rope_local;  // Gemma 3 sliding layers (rope_local_base_freq); equal to
                        // `rope` for every other architecture

  // Gemma 3 specifics.
  bool gemma_norm = false;           // RMSNorm multiplies by (1 + weight)
  bool sandwich_norm = false;        // post-attention and pre/post-feedforward norms
  float embed_scale = 1.0f;          // embeddings multiplied by sqrt(hidden_size)
  float query_scale = 0.0f;          // attention scale; 0 means 1/sqrt(head_dim)
  float final_logit_softcap = 0.0f;  // 0 = none
  float attn_logit_softcap = 0.0f;   // 0 = none

  // config.json's quantization_config (engine/model/quant_config.h).
  QuantConfig quant;
  MoeSpec moe;  // num_experts 0: dense

  int bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // config.json and generation_config.json

  // Reads `dir`/config.json and, if present, `dir`/generation_config.json.
  // Errors name the file and the field.
  static Result<ModelConfig> Load(const std::filesystem::path& dir);
  // Parses config.json text (generation config not applied).
  static Result<ModelConfig> FromJsonText(const std::string& text, const std::string& source_name);

  // True when layer `layer`'s MLP is a mixture of experts.
  bool IsMoeLayer(int layer) const;
  bool IsMoe() const { return moe.num_experts > 0; }

  // query_scale if set, else 1/sqrt(head_dim).
  float AttentionScale() const;
  // Layers, kv heads, head dim and per-layer kinds/windows, groups built.
  cache::ModelCacheSpec CacheSpec(cache::KvDtype kv_dtype) const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace agentkv::model
