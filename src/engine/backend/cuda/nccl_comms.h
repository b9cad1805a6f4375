// NcclComms: one NCCL communicator per GPU of one process (tensor
// parallelism: one worker thread and stream per GPU, docs/tensor-parallel.md),
// made together by ncclCommInitAll; and NcclRank, one rank's handle for the
// collectives a step needs, enqueued on the rank's stream (and so captured
// into its CUDA graphs like any kernel).
//
// NVLink multicast (NVLS) stays off: NCCL reads NCCL_NVLS_ENABLE from the
// process environment when it makes its first communicator, and on the lent
// machines multicast can take the host's GPUs out of service. The command
// line sets it to "0" at start unless the user set it, and passes the value
// down in NcclOptions; Create refuses an empty value (nobody settled it, and
// NCCL's default would use multicast where the GPUs have it). Nothing here
// reads the environment or calls cuMulticastCreate.
//
// Thread-safety: Create and the destructor on one thread while no
// collective is in flight; after Create, each rank's NcclRank is used by
// that rank's thread only (NCCL allows one thread per communicator; every
// rank must enqueue the same collectives in the same order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace agentkv::backend::cuda {

struct NcclOptions {
  // NCCL_NVLS_ENABLE as the process environment holds it (see above).
  std::string nvls_enable;
  // Whether the buffers that tensor parallelism sums (the residual stream)
  // live in NCCL symmetric windows (NcclWindows), so that their
  // all-reduces run NCCL's symmetric kernels. Where windows cannot be made
  // (NCCL before 2.27, no CUDA VMM) the plain buffers serve, as when off.
  bool symmetric_windows = true;
};

// Whether this build has NCCL (found beside the CUDA toolkit at configure
// time: NVIDIA ships it as its own package, so a toolkit may lack it). A
// build without it runs one GPU as usual and refuses NcclComms::Create.
bool NcclBuilt();

// The version code of the NCCL library loaded (ncclGetVersion: 22809 for
// 2.28.9); 0 in a build without NCCL or where it cannot say.
int NcclLoadedVersion();

// The CUDA devices this process sees (0 without a driver or device).
int VisibleGpus();

// One rank's collectives, in place, on `stream` (of the rank's device).
class NcclRank {
 public:
  NcclRank() = default;
  // `comm`: an ncclComm_t (opaque here, so that this header needs no
  // nccl.h).
  NcclRank(void* comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool active() const { return comm_ != nullptr && size_ > 1; }
  // buf[i] = sum over ranks of buf[i].
  Status SumF32(float* buf, size_t count, cudaStream_t stream) const;
  Status SumBf16(void* buf, size_t count, cudaStream_t stream) const;
  // buf[i] = max over ranks of buf[i] (the argmax keys of tp_combine.h).
  Status MaxU64(uint64_t* buf, size_t count, cudaStream_t stream) const;

 private:
  enum class Op { kSumF32, kSumBf16, kMaxU64 };
  Status AllReduce(void* buf, size_t count, Op op, cudaStream_t stream) const;
  void* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

class NcclComms {
 public:
  // Communicators over `devices` (rank i on devices[i]). InvalidArgument:
  // options.nvls_enable empty, no devices, a device repeated or not
  // visible; Unimplemented: a build without NCCL (NcclBuilt).
  static Result<std::unique_ptr<NcclComms>> Create(std::span<const int> devices,
                                                   const NcclOptions& options);
  ~NcclComms();
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  int device(int rank) const { return devices_.at(rank); }
  NcclRank rank(int r) const { return NcclRank(comms_.at(r), r, size()); }
  // Rank r's ncclComm_t (opaque here; for NcclWindows).
  void* comm(int r) const { return comms_.at(r); }

 private:
  NcclComms() = default;
  std::vector<int> devices_;
  std::vector<void*> comms_;  // ncclComm_t each
};

}  // namespace agentkv::backend::cuda
