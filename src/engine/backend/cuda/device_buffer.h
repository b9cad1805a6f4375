// DeviceBuffer: an owned cudaMalloc allocation (move-only; freed on
// destruction). PinnedBuffer: the same for page-locked host memory
// (cudaMallocHost), for async copies. Not thread-safe; owned by one backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "engine/backend/cuda/status.h"

namespace agentkv::backend::cuda {

template <bool kPinned>
class BasicBuffer {
 public:
  BasicBuffer() = default;
  BasicBuffer(const BasicBuffer&) = delete;
  BasicBuffer& operator=(const BasicBuffer&) = delete;
  BasicBuffer(BasicBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  BasicBuffer& operator=(BasicBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~BasicBuffer() { Free(); }

  // Frees the old allocation and takes `bytes` new ones (contents undefined).
  Status Allocate(size_t bytes) {
    Free();
    if (bytes == 0) return Status::Ok();
    void* p = nullptr;
    if constexpr (kPinned) {
      CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes));
    } else {
      CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    }
    p_ = p;
    n_ = bytes;
    return Status::Ok();
  }
  void Free() {
    if (p_ != nullptr) {
      if constexpr (kPinned) {
        cudaFreeHost(p_);
      } else {
        cudaFree(p_);
      }
    }
    p_ = nullptr;
    n_ = 0;
  }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

using DeviceBuffer = BasicBuffer<false>;
using PinnedBuffer = BasicBuffer<true>;

}  // namespace agentkv::backend::cuda
