// Creates the backend named by --device for a checkpoint directory.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/cuda_tuning.h"

namespace agentkv::backend {

struct BackendOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  int threads = 0;             // cpu: worker threads, 0 = all cores
  // "bf16": the backend's unquantized cache (bf16 on cuda; on the cpu, the
  // reference, fp32 as always); "fp8": e4m3 with per-row scales
  // (docs/kv-fp8.md). Part of the fingerprint of every persisted KV record.
  std::string kv_dtype = "bf16";
  // cuda: kernel choices and diagnostics (the command line fills them from
  // the AGENTKV_CUDA_* variables; docs/cuda.md).
  CudaTuning cuda;
  // cuda: GPUs the model is split over (tensor parallelism,
  // docs/tensor-parallel.md); 1 is the single-GPU backend. Above 1 the
  // split (TpPlan) and the visible GPUs are checked before any weight is
  // read.
  int tensor_parallel = 1;
  // NCCL_NVLS_ENABLE as the command line settled it at start (it sets "0"
  // unless the user set it); tensor parallelism refuses an empty value.
  std::string nccl_nvls_enable;
  // Tensor parallelism: the all-reduced buffers in NCCL symmetric windows
  // (lower-latency all-reduce kernels; cuda::NcclOptions::symmetric_windows).
  // Plain buffers serve where windows cannot be made.
  bool tp_symmetric_windows = true;
};

// The KV dtype `options` asks of its device (see BackendOptions::kv_dtype);
// InvalidArgument for an unknown name.
Result<cache::KvDtype> ResolveKvDtype(const BackendOptions& options);

// Loads config.json (+ generation_config.json) and the weights of `model_dir`
// and builds the backend. KV storage is not allocated yet (AllocateKv).
Result<std::unique_ptr<Backend>> CreateBackend(const std::filesystem::path& model_dir,
                                               const BackendOptions& options);

}  // namespace agentkv::backend
