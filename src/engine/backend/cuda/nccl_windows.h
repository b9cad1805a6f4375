// NcclWindows: one device buffer per rank of an NcclComms, allocated by
// ncclMemAlloc and registered together as a symmetric NCCL window
// (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC, NCCL 2.27 and
// later). An all-reduce whose buffer lies in the window at the same offset
// on every rank runs NCCL's symmetric kernels, which read and write the
// peers' buffers directly over NVLink (the P2P transport; NVLink multicast
// stays off) instead of staging through NCCL's own buffers: lower latency
// for the small all-reduces of decode steps (docs/tensor-parallel.md,
// "All-reduce buffers"). Sums of fp32, bf16 and fp16 qualify; other
// all-reduces (the argmax keys' max of u64) run NCCL's usual kernels,
// wherever their buffers are.
//
// Registration is collective: Create and the destructor register and
// deregister every rank's buffer in one NCCL group from the calling
// thread, so no rank can be left waiting for another.
//
// Thread-safety: Create and the destructor on one thread, while no
// collective on the windows is in flight or captured in a live graph; the
// buffers are then used by each rank's thread (the rank's own only).
// Owns the buffers; the NcclComms must outlive it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cuda/nccl_comms.h"
#include "util/status.h"

namespace agentkv::backend::cuda {

// NCCL's alignment of a window's size and of offsets into it that stay
// symmetric (NCCL_WIN_REQUIRED_ALIGNMENT).
inline constexpr size_t kNcclWindowAlign = 4096;

class NcclWindows {
 public:
  // Whether this build (nccl.h) and the NCCL library loaded both have
  // symmetric windows (2.27 or later); if not, why in `why`.
  static bool Supported(std::string* why);
  // `bytes` (rounded up to kNcclWindowAlign) on every rank of `comms`,
  // zeroed and registered. Unimplemented: not Supported; NCCL's errors
  // otherwise (e.g. no CUDA VMM support): nothing stays allocated or
  // registered then.
  static Result<std::unique_ptr<NcclWindows>> Create(const NcclComms& comms, size_t bytes);
  ~NcclWindows();
  NcclWindows(const NcclWindows&) = delete;
  NcclWindows& operator=(const NcclWindows&) = delete;

  size_t bytes() const { return bytes_; }
  void* ptr(int rank) const { return ptrs_.at(rank); }

 private:
  NcclWindows() = default;
  // Deregisters (one group) and frees what is held.
  void Release();
  std::vector<int> devices_;
  std::vector<void*> comms_;  // ncclComm_t each (not owned)
  std::vector<void*> ptrs_;   // ncclMemAlloc'd
  std::vector<void*> wins_;   // ncclWindow_t each
  size_t bytes_ = 0;
};

}  // namespace agentkv::backend::cuda
