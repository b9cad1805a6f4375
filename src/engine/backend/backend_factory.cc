#include "engine/backend/backend_factory.h"

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/tp_plan.h"
#include "engine/model/safetensors_weights.h"
#ifdef AGENTKV_HAVE_CUDA
#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/tp_backend.h"
#endif

namespace agentkv::backend {

Result<cache::KvDtype> ResolveKvDtype(const BackendOptions& options) {
  if (options.kv_dtype == "fp8") return cache::KvDtype::kFP8E4M3;
  if (options.kv_dtype == "bf16")
    return options.device == "cpu" ? cache::KvDtype::kF32 : cache::KvDtype::kBF16;
  return InvalidArgument("unknown --kv-dtype '" + options.kv_dtype + "' (use bf16 or fp8)");
}

Result<std::unique_ptr<Backend>> CreateBackend(const std::filesystem::path& model_dir,
                                               const BackendOptions& options) {
  ASSIGN_OR_RETURN(const cache::KvDtype kv_dtype, ResolveKvDtype(options));
  ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfig::Load(model_dir));
  const int tp = options.tensor_parallel;
  if (tp != 1) {
    // Refused at start, before any weight is read.
    if (tp < 1)
      return InvalidArgument("--tensor-parallel must be at least 1, not " + std::to_string(tp));
    if (options.device != "cuda")
      return InvalidArgument("--tensor-parallel " + std::to_string(tp) +
                             " splits a model over GPUs: it needs --device cuda");
#ifdef AGENTKV_HAVE_CUDA
    RETURN_IF_ERROR(TpPlan::Make(config, tp, cuda::VisibleGpus()).status());
    if (!cuda::NcclBuilt())
      return Unimplemented("--tensor-parallel " + std::to_string(tp) +
                           " needs NCCL, and this agentkv was built without it (install NCCL's "
                           "development package beside the CUDA toolkit and rebuild)");
#else
    return Unimplemented(
        "--device cuda: this build has no CUDA backend (no CUDA toolkit was found when it was "
        "configured)");
#endif
  }
  ASSIGN_OR_RETURN(model::SafetensorsWeights weights, model::SafetensorsWeights::Open(model_dir));
  if (options.device == "cpu") {
    ASSIGN_OR_RETURN(std::unique_ptr<cpu::CpuBackend> b,
                     cpu::CpuBackend::Create(config, weights,
                                             cpu::CpuBackendOptions{options.threads, kv_dtype}));
    return std::unique_ptr<Backend>(std::move(b));
  }
  if (options.device == "cuda") {
#ifdef AGENTKV_HAVE_CUDA
    cuda::CudaBackendOptions co;
    co.kv_dtype = kv_dtype;
    co.tuning = options.cuda;
    if (tp > 1) {
      cuda::TpBackendOptions to;
      to.degree = tp;
      to.rank = co;
      to.nccl.nvls_enable = options.nccl_nvls_enable;
      to.nccl.symmetric_windows = options.tp_symmetric_windows;
      ASSIGN_OR_RETURN(std::unique_ptr<cuda::TpBackend> b,
                       cuda::TpBackend::Create(config, weights, to));
      return std::unique_ptr<Backend>(std::move(b));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> b,
                     cuda::CudaBackend::Create(config, weights, co));
    return std::unique_ptr<Backend>(std::move(b));
#else
    return Unimplemented(
        "--device cuda: this build has no CUDA backend (no CUDA toolkit was found when it was "
        "configured)");
#endif
  }
  return InvalidArgument("unknown --device '" + options.device + "' (use cpu or cuda)");
}

}  // namespace agentkv::backend
