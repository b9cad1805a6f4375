// Creates the backend named by --device for a checkpoint directory.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "engine/backend.h"

namespace agentkv {

struct BackendOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  int threads = 0;             // cpu: worker threads, 0 = all cores
};

// Loads config.json (+ generation_config.json) and the weights of `model_dir`
// and builds the backend. KV storage is not allocated yet (AllocateKv).
Result<std::unique_ptr<Backend>> CreateBackend(const std::filesystem::path& model_dir,
                                               const BackendOptions& options);

}  // namespace agentkv
