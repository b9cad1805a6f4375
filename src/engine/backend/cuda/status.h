// Turning CUDA runtime and cuBLAS errors into Status, with the call, file and
// line that failed (out of device memory: ResourceExhausted; the rest:
// Internal); and the question whether a usable GPU is present.
// Thread-safe (plain functions).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "util/status.h"

namespace agentkv::backend::cuda {

Status CudaStatus(cudaError_t e, const char* expr, const char* file, int line);
Status CublasStatus(cublasStatus_t e, const char* expr, const char* file, int line);

// Ok when at least one CUDA device can be used; otherwise Unimplemented
// naming why (no driver, no device), for tests to skip on and for
// `--device cuda` to report.
Status DeviceAvailable();

}  // namespace agentkv::backend::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                             \
  do {                                                                                         \
    const cudaError_t agentkv_cuda_e_ = (expr);                                                \
    if (agentkv_cuda_e_ != cudaSuccess)                                                        \
      return ::agentkv::backend::cuda::CudaStatus(agentkv_cuda_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                                                               \
  do {                                                                                             \
    const cublasStatus_t agentkv_cublas_e_ = (expr);                                               \
    if (agentkv_cublas_e_ != CUBLAS_STATUS_SUCCESS)                                                \
      return ::agentkv::backend::cuda::CublasStatus(agentkv_cublas_e_, #expr, __FILE__, __LINE__); \
  } while (0)
