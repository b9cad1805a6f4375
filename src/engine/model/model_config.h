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

namespace agentkv {

enum class Architecture { kLlama, kQwen2, kQwen3, kMistral, kGemma3 };

enum class Activation { kSilu, kGeluTanh };

struct RopeSpec {
  float theta = 10000.0f;
  // "default", "linear" (factor) or "llama3" (factor, low/high_freq_factor,
  // original_max_position_embeddings).
  std::string type = "default";
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;

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
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k (Qwen3, Gemma 3)

  // Per-layer attention kind and window (tokens a query sees, itself
  // included); window 0 for full attention.
  std::vector<AttentionKind> layer_kinds;
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

  int bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // config.json and generation_config.json

  // Reads `dir`/config.json and, if present, `dir`/generation_config.json.
  // Errors name the file and the field.
  static Result<ModelConfig> Load(const std::filesystem::path& dir);
  // Parses config.json text (generation config not applied).
  static Result<ModelConfig> FromJsonText(const std::string& text, const std::string& source_name);

  // query_scale if set, else 1/sqrt(head_dim).
  float AttentionScale() const;
  // Layers, kv heads, head dim and per-layer kinds/windows, groups built.
  ModelCacheSpec CacheSpec(KvDtype kv_dtype) const;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace agentkv
