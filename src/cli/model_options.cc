#include "cli/model_options.h"

#include <cstdlib>
#include <filesystem>

namespace agentkv::cli {

void ModelOptions::Add(CLI::App& app, bool model_required) {
  auto* m = app.add_option("--model", model_dir, "Hugging Face checkpoint directory");
  if (model_required) m->required();
  app.add_option("--device", backend.device, "Backend: cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", backend.threads, "CPU worker threads (0 = all cores)")
      ->capture_default_str();
  app.add_option("--kv-dtype", backend.kv_dtype,
                 "KV cache dtype: bf16 (unquantized: bf16 on cuda, fp32 on the cpu) or fp8 "
                 "(e4m3, per-row scales; about half the bytes per token)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}));
  // Switches for comparisons and diagnostics, not flags: scripts set them
  // around any command (docs/cuda.md).
  backend.cuda = backend::CudaTuningFromEnv([](const char* name) { return std::getenv(name); });
  app.add_option("--tensor-parallel", backend.tensor_parallel,
                 "GPUs to split the model over (--device cuda; one process, NCCL)")
      ->envname("AGENTKV_TENSOR_PARALLEL")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tp-windows", backend.tp_symmetric_windows,
                 "Tensor parallelism: all-reduce from NCCL symmetric windows (true) or plain "
                 "buffers (false)")
      ->envname("AGENTKV_TP_WINDOWS")
      ->capture_default_str();
  // main() settled it before anything else ran (NVLink multicast off unless
  // the user set it); the backend refuses to start NCCL without it.
  if (const char* nvls = std::getenv("NCCL_NVLS_ENABLE")) backend.nccl_nvls_enable = nvls;
}

void SamplingOptions::Add(CLI::App& app) {
  params.temperature = 0.0f;  // the command line defaults to greedy
  app.add_option("--max-tokens", max_tokens, "Most tokens to generate")->capture_default_str();
  app.add_option("--temperature", params.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", params.top_p, "Nucleus sampling mass")->capture_default_str();
  app.add_option("--top-k", params.top_k, "Keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  app.add_option("--min-p", params.min_p, "Drop tokens below min_p x the top probability")
      ->capture_default_str();
  app.add_option("--seed", seed, "Sampling seed (-1 = random)")->capture_default_str();
  app.add_option("--repetition-penalty", params.repetition_penalty)->capture_default_str();
  app.add_option("--presence-penalty", params.presence_penalty)->capture_default_str();
  app.add_option("--frequency-penalty", params.frequency_penalty)->capture_default_str();
  app.add_option("--stop", params.stop, "Stop string (repeatable)");
  app.add_option("--stop-token", params.stop_token_ids, "Stop token id (repeatable)");
  app.add_flag("--ignore-eos", params.ignore_eos, "Do not stop at end-of-sequence tokens");
}

engine::SamplingParams SamplingOptions::Get() const {
  engine::SamplingParams p = params;
  p.max_tokens = max_tokens;
  if (seed >= 0) p.seed = static_cast<uint64_t>(seed);
  return p;
}

bool ParseIds(const std::string& text, std::vector<int32_t>& ids, std::string& error) {
  ids.clear();
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string part = text.substr(i, j - i);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0 || v > INT32_MAX) {
      error = "bad token id '" + part + "' in --ids";
      ids.clear();
      return false;
    }
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  if (ids.empty()) error = "--ids is empty";
  return !ids.empty();
}

std::string DefaultModelDir() {
  if (const char* e = std::getenv("AGENTKV_MODEL"); e && *e) return e;
  return "data/models/default";
}

}  // namespace agentkv::cli
