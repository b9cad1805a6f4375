// Small checkpoints written by `model synth` for the CUDA tests of
// quantized weights (backend_quant_test.cc, tp_backend_test.cc): where the
// tokenizer synth copies in is found, the options those tests start from
// (and their two recurring shapes), and a checkpoint written and opened.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "engine/model/model_config.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors_weights.h"

namespace agentkv::testing {

// The tokenizers (synth copies one into each checkpoint): the source
// tree's, or on the GPU machine, where the tests run from the repository
// root without it, the device pack's (tools/device/pack_cuda.sh).
inline std::filesystem::path Tokenizers() {
  namespace fs = std::filesystem;
  for (const fs::path& p :
       {fs::path(AGENTKV_DATA_DIR) / "tokenizers", fs::path(".devcarry") / "tokenizers"})
    if (fs::exists(p / "qwen3" / "tokenizer.json")) return p;
  return fs::path(AGENTKV_DATA_DIR) / "tokenizers";
}

// Whether the qwen3 tokenizer the checkpoints copy is there (tests skip
// without it: scripts/setup.sh).
inline bool HaveSynthTokenizer() {
  return std::filesystem::exists(Tokenizers() / "qwen3" / "tokenizer.json");
}

// `arch` quantized as `quant` into `dir`: 2 layers of 4 query and 2 KV
// heads, the qwen3 tokenizer, an LM head of std 0.5 (logits spread enough
// for greedy picks to be decided), from `seed`; the sizes are the test's.
inline model::SynthOptions SynthBase(const std::string& arch, model::SynthQuant quant,
                                     const std::filesystem::path& dir, uint32_t seed) {
  model::SynthOptions o;
  o.arch = arch;
  o.tokenizer_dir = Tokenizers() / "qwen3";
  o.out_dir = dir;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.seed = seed;
  o.lm_head_std = 0.5;
  o.quant = quant;
  return o;
}

// GPT-OSS at hidden 64 (heads of 16): 5 experts of `intermediate`, 2 a
// token, sliding layers of window 8.
inline void SmallGptOssShape(model::SynthOptions* o, int intermediate) {
  o->hidden = 64;
  o->head_dim = 16;
  o->intermediate = intermediate;
  o->experts = 5;
  o->experts_per_token = 2;
  o->sliding_window = 8;
}

// A dense model at hidden 160 (two 128-wide scale blocks, the second
// ragged; heads of 32), MLP `intermediate` wide.
inline void SmallDenseShape(model::SynthOptions* o, int intermediate) {
  o->hidden = 160;
  o->head_dim = 32;
  o->intermediate = intermediate;
}

// A checkpoint as written and opened.
struct SynthCheckpoint {
  model::ModelConfig config;
  std::optional<model::SafetensorsWeights> weights;
};

// Writes the checkpoint `o` describes (into o.out_dir) and opens it into
// *out; a failure says which step failed.
inline ::testing::AssertionResult WriteAndOpen(const model::SynthOptions& o, SynthCheckpoint* out) {
  if (const Status st = model::SynthesizeModel(o); !st.ok())
    return ::testing::AssertionFailure() << "synth: " << st.ToString();
  auto c = model::ModelConfig::Load(o.out_dir);
  if (!c.ok()) return ::testing::AssertionFailure() << "config: " << c.status().ToString();
  auto w = model::SafetensorsWeights::Open(o.out_dir);
  if (!w.ok()) return ::testing::AssertionFailure() << "weights: " << w.status().ToString();
  out->config = std::move(c).value();
  out->weights.emplace(std::move(w).value());
  return ::testing::AssertionSuccess();
}

}  // namespace agentkv::testing
