#include "engine/backend/backend_factory.h"

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/safetensors_weights.h"
#ifdef AGENTKV_HAVE_CUDA
#include "engine/backend/cuda/backend.h"
#endif

namespace agentkv {

Result<KvDtype> ResolveKvDtype(const BackendOptions& options) {
  if (options.kv_dtype == "fp8") return KvDtype::kFP8E4M3;
  if (options.kv_dtype == "bf16") return options.device == "cpu" ? KvDtype::kF32 : KvDtype::kBF16;
  return InvalidArgument("unknown --kv-dtype '" + options.kv_dtype + "' (use bf16 or fp8)");
}

Result<std::unique_ptr<Backend>> CreateBackend(const std::filesystem::path& model_dir,
                                               const BackendOptions& options) {
  ASSIGN_OR_RETURN(const KvDtype kv_dtype, ResolveKvDtype(options));
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(model_dir));
  ASSIGN_OR_RETURN(SafetensorsWeights weights, SafetensorsWeights::Open(model_dir));
  if (options.device == "cpu") {
    ASSIGN_OR_RETURN(
        std::unique_ptr<CpuBackend> b,
        CpuBackend::Create(config, weights, CpuBackendOptions{options.threads, kv_dtype}));
    return std::unique_ptr<Backend>(std::move(b));
  }
  if (options.device == "cuda") {
#ifdef AGENTKV_HAVE_CUDA
    CudaBackendOptions co;
    co.kv_dtype = kv_dtype;
    co.tuning = options.cuda;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(config, weights, co));
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
