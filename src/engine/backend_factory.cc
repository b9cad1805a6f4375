#include "engine/backend_factory.h"

#include "engine/cpu_backend.h"
#include "engine/safetensors_weights.h"
#ifdef AGENTKV_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

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
#ifdef AGENTKV_HAVE_CUDA
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b,
                     CudaBackend::Create(config, weights, CudaBackendOptions{}));
    return std::unique_ptr<Backend>(std::move(b));
#else
    return Unimplemented(
        "--device cuda: this build has no CUDA backend (no CUDA toolkit was found when it was "
        "configured)");
#endif
  }
  return InvalidArgument("unknown --device '" + options.device + "' (use cpu or cuda)");
}

}  // namespace agentkv
