// ReduceBuffer: device memory that tensor parallelism all-reduces (a
// rank's residual stream): either a view into the rank's symmetric NCCL
// window (NcclWindows, owned by TpBackend: its all-reduces then run NCCL's
// symmetric kernels) or an allocation of its own, as DeviceBuffer. The
// accessors are DeviceBuffer's, so the code that reads and writes it does
// not care which.
//
// Not thread-safe; owned by one backend. A view must not outlive the
// window it points into (CudaBackend::SetReduceArena).
#pragma once

#include <cstddef>

#include "engine/backend/cuda/device_buffer.h"

namespace agentkv::backend::cuda {

class ReduceBuffer {
 public:
  // An allocation of its own of `bytes` (contents undefined).
  Status Allocate(size_t bytes) {
    view_ = nullptr;
    view_bytes_ = 0;
    return own_.Allocate(bytes);
  }
  // `bytes` at `p`, memory someone else owns (a window).
  void View(void* p, size_t bytes) {
    own_.Free();
    view_ = p;
    view_bytes_ = bytes;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(view_ != nullptr ? view_ : own_.get());
  }
  size_t bytes() const { return view_ != nullptr ? view_bytes_ : own_.bytes(); }
  bool is_view() const { return view_ != nullptr; }

 private:
  DeviceBuffer own_;
  void* view_ = nullptr;
  size_t view_bytes_ = 0;
};

}  // namespace agentkv::backend::cuda
