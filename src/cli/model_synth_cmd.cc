// `agentkv model synth`: writes a checkpoint with a real architecture and
// tokenizer and seeded random weights (see engine/model/model_synth.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "engine/model/model_synth.h"
#include "engine/model/safetensors_file.h"

namespace agentkv::cli {
namespace {

struct SynthFlags {
  model::SynthOptions opts;
  std::string dtype = "bf16";
  std::string quant = "none";
  bool tie = false;
  bool no_tie = false;
};

int RunSynth(SynthFlags& f) {
  if (f.tie && f.no_tie) {
    std::fprintf(stderr, "error: --tie and --no-tie are mutually exclusive\n");
    return 2;
  }
  if (f.tie) f.opts.tie = true;
  if (f.no_tie) f.opts.tie = false;
  if (f.dtype == "bf16") {
    f.opts.dtype = model::TensorDtype::kBF16;
  } else if (f.dtype == "f16") {
    f.opts.dtype = model::TensorDtype::kF16;
  } else {
    f.opts.dtype = model::TensorDtype::kF32;
  }

  if (f.opts.tokenizer_dir.empty()) {
    // GPT-OSS has one tokenizer (o200k_harmony); setup puts it, with the
    // harmony chat template, in data/tokenizers/gptoss.
    const std::filesystem::path gptoss = "data/tokenizers/gptoss";
    if (f.opts.arch != "gpt_oss" || !std::filesystem::exists(gptoss / "tokenizer.json")) {
      std::fprintf(stderr, "error: --tokenizer is required%s\n",
                   f.opts.arch == "gpt_oss" ? " (data/tokenizers/gptoss not found)" : "");
      return 2;
    }
    f.opts.tokenizer_dir = gptoss;
  }

  auto quant = model::ParseSynthQuant(f.quant);
  if (!quant.ok()) {
    std::fprintf(stderr, "error: %s\n", quant.status().ToString().c_str());
    return 2;
  }
  f.opts.quant = *quant;

  const bool tty = isatty(STDERR_FILENO) != 0;
  auto last = std::chrono::steady_clock::now();
  model::SynthProgress progress;
  if (tty) {
    progress = [&last](uint64_t done, uint64_t total) {
      auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(200)) return;
      last = now;
      std::fprintf(stderr, "\rwriting weights: %llu / %llu MiB (%3.0f%%)",
                   static_cast<unsigned long long>(done >> 20),
                   static_cast<unsigned long long>(total >> 20),
                   total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0);
      if (done == total) std::fprintf(stderr, "\n");
    };
  }
  Status st = model::SynthesizeModel(f.opts, progress);
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s\n", f.opts.out_dir.string().c_str());
  return 0;
}

Registrar reg(
    "model synth",
    "Write a Hugging Face checkpoint with a real architecture and tokenizer and seeded random "
    "weights",
    [](CLI::App& app) -> Runner {
      auto f = std::make_shared<SynthFlags>();
      model::SynthOptions& o = f->opts;
      app.add_option("--arch", o.arch, "Architecture")
          ->required()
          ->check(CLI::IsMember(
              {"llama", "qwen2", "qwen3", "mistral", "gemma3", "gpt_oss", "qwen3_moe"}));
      app.add_option("--tokenizer", o.tokenizer_dir,
                     "Directory with tokenizer.json and tokenizer_config.json (and "
                     "chat_template.jinja, copied when present); gpt_oss: "
                     "data/tokenizers/gptoss when omitted");
      app.add_option("--out", o.out_dir, "Output checkpoint directory")->required();
      app.add_option("--layers", o.layers, "Decoder layers")->capture_default_str();
      app.add_option("--hidden", o.hidden, "Hidden size")->capture_default_str();
      app.add_option("--heads", o.heads, "Attention heads")->capture_default_str();
      app.add_option("--kv-heads", o.kv_heads, "Key/value heads (GQA)")->capture_default_str();
      app.add_option("--lm-head-std", o.lm_head_std,
                     "Standard deviation of the LM head's weights (0 = 0.02; peaked "
                     "distributions; needs an untied LM head)")
          ->capture_default_str();
      app.add_option("--eos-bias", o.eos_bias,
                     "Make replies end: the LM head's weight on a constant feature for the "
                     "eos token (0 = off; needs an untied LM head)")
          ->capture_default_str();
      app.add_option("--head-dim", o.head_dim, "Head dimension (0: hidden / heads)")
          ->capture_default_str();
      app.add_option("--intermediate", o.intermediate,
                     "MLP intermediate size (0: 3 * hidden; gpt_oss: the experts', 0: hidden)")
          ->capture_default_str();
      app.add_option("--experts", o.experts, "Experts per layer (gpt_oss, qwen3_moe; 0: 8)")
          ->capture_default_str();
      app.add_option("--experts-per-token", o.experts_per_token,
                     "Experts each token is routed to (0: gpt_oss 4, qwen3_moe 2)")
          ->capture_default_str();
      app.add_option("--moe-intermediate", o.moe_intermediate,
                     "qwen3_moe expert intermediate size (0: hidden)")
          ->capture_default_str();
      app.add_option("--vocab", o.vocab,
                     "Vocabulary size (0: the tokenizer's highest token id + 1)")
          ->capture_default_str();
      app.add_option("--max-position", o.max_position, "max_position_embeddings")
          ->capture_default_str();
      app.add_option(
             "--sliding-window", o.sliding_window,
             "Sliding window (0: architecture default; gemma3 512, gpt_oss 128, others none)")
          ->capture_default_str();
      app.add_option("--seed", o.seed, "Weight seed")->capture_default_str();
      app.add_option("--dtype", f->dtype, "Weight dtype")
          ->check(CLI::IsMember({"bf16", "f16", "f32"}))
          ->capture_default_str();
      app.add_option("--quant", f->quant,
                     "Store the linear layers quantized as published checkpoints do: fp8 "
                     "(e4m3, 128x128 block scales), fp8-channel (compressed-tensors, per-channel "
                     "scales), mxfp4 (gpt_oss experts)")
          ->check(CLI::IsMember({"none", "fp8", "fp8-channel", "mxfp4"}))
          ->capture_default_str();
      app.add_flag("--tie", f->tie, "Tie lm_head to the embeddings (default except mistral)");
      app.add_flag("--no-tie", f->no_tie, "Separate lm_head weights");
      app.add_option("--rope-theta", o.rope_theta, "RoPE base (0: architecture default)")
          ->capture_default_str();
      return [f] { return RunSynth(*f); };
    });

}  // namespace
}  // namespace agentkv::cli
