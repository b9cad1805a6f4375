#include "engine/backend/cuda/status.h"

#include <string>
#include <utility>

namespace agentkv::backend::cuda {

Status CudaStatus(cudaError_t e, const char* expr, const char* file, int line) {
  std::string m = std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                  ") in " + expr + " at " + file + ":" + std::to_string(line);
  // Out of device memory is exhaustion (too large a KV budget or step
  // budget for the card), not a bug.
  if (e == cudaErrorMemoryAllocation) return ResourceExhausted(std::move(m));
  return Internal(std::move(m));
}

Status CublasStatus(cublasStatus_t e, const char* expr, const char* file, int line) {
  return Internal(std::string("cuBLAS error ") + cublasGetStatusName(e) + " (" +
                  cublasGetStatusString(e) + ") in " + expr + " at " + file + ":" +
                  std::to_string(line));
}

Status DeviceAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return Unimplemented(std::string("no usable CUDA device: ") + cudaGetErrorName(e) + " (" +
                         cudaGetErrorString(e) + ")");
  }
  if (n == 0) return Unimplemented("no CUDA device present");
  return Status::Ok();
}

}  // namespace agentkv::backend::cuda
