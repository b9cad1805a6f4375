// ReduceBuffer: device memory that tensor parallelism all-reduces (a
// rank's residual stream): an allocation of its own for whole steps and,
// where the rank has a symmetric NCCL window (NcclWindows, owned by
// TpBackend), a view into it for steps small enough to sum from it (NCCL's
// symmetric kernels; TpReduceFromWindow). One of the two is in use at a
// time (UseWindow); the accessors are DeviceBuffer's and give the one in
// use, so the code that reads and writes it does not care which.
//
// Not thread-safe; owned by one backend. A view must not outlive the
// window it points into (CudaBackend::SetReduceArena).
#pragma once

#include <cstddef>

#include "engine/backend/cuda/device_buffer.h"

namespace agentkv::backend::cuda {

class ReduceBuffer {
 public:
  // The allocation of its own, `bytes` (contents undefined); in use until
  // UseWindow(true). The view, if any, stays.
  Status Allocate(size_t bytes) {
    in_window_ = false;
    return own_.Allocate(bytes);
  }
  // `bytes` at `p`, memory someone else owns (the window); null: none. The
  // allocation is in use until UseWindow(true).
  void SetWindow(void* p, size_t bytes) {
    view_ = p;
    view_bytes_ = p != nullptr ? bytes : 0;
    in_window_ = false;
  }
  // The view (true: requires one) or the allocation (false) in use from
  // now on.
  void UseWindow(bool on) { in_window_ = on && view_ != nullptr; }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(in_window_ ? view_ : own_.get());
  }
  size_t bytes() const { return in_window_ ? view_bytes_ : own_.bytes(); }
  // The view is in use.
  bool in_window() const { return in_window_; }
  bool has_window() const { return view_ != nullptr; }
  // The view itself (null: none), whichever is in use.
  template <typename T = void>
  T* window() const {
    return static_cast<T*>(view_);
  }
  size_t window_bytes() const { return view_bytes_; }

 private:
  DeviceBuffer own_;
  void* view_ = nullptr;
  size_t view_bytes_ = 0;
  bool in_window_ = false;
};

}  // namespace agentkv::backend::cuda
