#include "engine/backend_factory.h"

#include "engine/cpu_backend.h"
#include "engine/safetensors_weights.h"

namespace agentkv {

Result<std::unique_ptr<Backend>> CreateBackend(const std::filesystem::path& model_dir,
                                               const BackendOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(model_dir));
  ASSIGN_OR_RETURN(SafetensorsWeights weights, SafetensorsWeights::Open(model_dir));
  if (options.device == "cpu") {
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b,
                     CpuBackend::Create(config, weights, CpuBackendOptions{options.threads}));
    return std::unique_ptr<Backend>(std::move(b));
  }
  if (options.device == "cuda") {
    return Unimplemented("--device cuda: this build has no CUDA backend");
  }
  return InvalidArgument("unknown --device '" + options.device + "' (use cpu or cuda)");
}

}  // namespace agentkv
