// Synthesizes a Hugging Face checkpoint with a real architecture, a real
// tokenizer and seeded random weights (`agentkv model synth`): config.json
// (top-level rope_theta convention), generation_config.json,
// model.safetensors, and copies of tokenizer.json / tokenizer_config.json.
//
// Weights are a pure function of (seed, tensor name, dtype, shape): each run
// on any machine produces the same bytes (own splitmix64 generator and
// Box-Muller transform; no std:: distributions). Linear, bias and embedding
// weights ~ N(0, 0.02); norm weights 1 + N(0, 0.1), or N(0, 0.1) for Gemma's
// (1 + w) norms. Tensors are generated and written in chunks, so memory use
// stays small whatever the model size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model_synth_quant.h"
#include "engine/model/safetensors_file.h"
#include "util/status.h"

namespace agentkv::model {

struct SynthOptions {
  // "llama", "qwen2", "qwen3", "mistral", "gemma3", or the mixtures of
  // experts "gpt_oss" (alternating 128-token sliding and full layers, sinks,
  // YaRN, biases) and "qwen3_moe"; these two write config.json in the
  // convention transformers 5 writes (rope_parameters, dtype,
  // num_local_experts).
  std::string arch;
  std::filesystem::path tokenizer_dir;  // holds tokenizer.json, tokenizer_config.json
  std::filesystem::path out_dir;        // created if missing; files overwritten
  int layers = 2;
  int hidden = 128;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 0;      // 0: hidden / heads
  int intermediate = 0;  // 0: 3 * hidden (gpt_oss: the experts', 0: hidden)
  // Mixtures of experts only (0: the defaults in brackets).
  int experts = 0;            // experts per layer (8)
  int experts_per_token = 0;  // (gpt_oss 4, qwen3_moe 2)
  int moe_intermediate = 0;   // qwen3_moe's expert intermediate size (hidden)
  int vocab = 0;              // 0: the tokenizer's (highest id + 1)
  int max_position = 32768;
  int sliding_window = 0;  // 0: architecture default (Gemma 3: 512; others none)
  uint64_t seed = 0;
  TensorDtype dtype = TensorDtype::kBF16;
  std::optional<bool> tie;  // default: untied for mistral, tied otherwise
  double rope_theta = 0;    // 0: architecture default
  // > 0: replies end. Random weights almost never pick the end-of-turn token
  // (1 in the vocabulary's size), so a random default model would run every
  // reply to max_tokens. With a bias, the last hidden dimension of every
  // embedding is 1.0 and every layer's output projections (o_proj,
  // down_proj) leave that dimension alone, so it reaches the final norm as
  // a constant feature; the LM head reads it with this weight for the
  // tokenizer's eos_token and 0 for every other token, which raises that
  // token's logit by about the same amount at every position. Needs an
  // untied LM head (the default when set).
  double eos_bias = 0;
  // > 0: the standard deviation of an untied LM head's weights instead of
  // 0.02. Random weights make nearly flat next-token distributions (logits
  // of about 0.3 standard deviation over a 150k vocabulary); a larger LM
  // head makes them peaked like a trained model's, so that a biased eos
  // token can be likely when sampling without being every greedy pick.
  double lm_head_std = 0;
  // Quantized storage of the linear layers (engine/model/model_synth_quant.h):
  // their values are the same draws as unquantized, packed.
  SynthQuant quant = SynthQuant::kNone;
};

// Called now and then while weights are written: bytes written, total bytes.
using SynthProgress = std::function<void(uint64_t done, uint64_t total)>;

// Errors: unknown arch, bad sizes, a vocab smaller than the tokenizer's,
// unreadable tokenizer files, I/O errors; each names the option or file.
Status SynthesizeModel(const SynthOptions& options, const SynthProgress& progress = nullptr);

// Highest token id in tokenizer.json (model vocab and added_tokens) + 1.
Result<int> TokenizerVocabSize(const std::filesystem::path& tokenizer_json);

// Fills `out` with `count` N(mean, stddev) samples of `name`'s tensor starting
// at element `first`, converted to `dtype` (little-endian). The result does
// not depend on how a tensor is split into calls.
void SynthFill(uint64_t seed, const std::string& name, TensorDtype dtype, double mean,
               double stddev, uint64_t first, uint64_t count, void* out);

}  // namespace agentkv::model
