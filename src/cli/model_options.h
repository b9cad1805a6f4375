// Options shared by the commands that load a model: --model, --device,
// --threads, --kv-dtype, the CUDA backend's tuning (from the environment),
// and sampling flags.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/backend/backend_factory.h"
#include "engine/sampling_params.h"

namespace agentkv::cli {

struct ModelOptions {
  std::string model_dir;
  backend::BackendOptions backend;
  // Registers the flags, and fills backend.cuda from the AGENTKV_CUDA_*
  // variables (the process's environment, read here and nowhere else).
  void Add(CLI::App& app, bool model_required = true);
};

struct SamplingOptions {
  engine::SamplingParams params;
  int64_t seed = -1;
  int32_t max_tokens = 128;
  void Add(CLI::App& app);
  engine::SamplingParams Get() const;
};

// Parses "1,2,3" into ids; an empty vector and a message on bad input.
bool ParseIds(const std::string& text, std::vector<int32_t>& ids, std::string& error);

// Default model directory (set-up synthesizes it): data/models/default
// beside the binary's source tree, or AGENTKV_MODEL.
std::string DefaultModelDir();

}  // namespace agentkv::cli
