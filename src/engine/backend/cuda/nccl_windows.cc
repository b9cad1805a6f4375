#include "engine/backend/cuda/nccl_windows.h"

#include <cuda_runtime_api.h>

#include <vector>

#if AGENTKV_HAVE_NCCL
#include <nccl.h>
#endif

// Symmetric windows arrived in NCCL 2.27. (Nested: without nccl.h,
// NCCL_VERSION is no macro and may not appear in an #if.)
#define AGENTKV_NCCL_WINDOWS 0
#if AGENTKV_HAVE_NCCL && defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#undef AGENTKV_NCCL_WINDOWS
#define AGENTKV_NCCL_WINDOWS 1
#endif
#endif

namespace agentkv::backend::cuda {
namespace {

#if AGENTKV_NCCL_WINDOWS
Status NcclError(ncclResult_t r, const std::string& what) {
  std::string m = "NCCL error " + std::string(ncclGetErrorString(r)) + " in " + what;
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    m += std::string(": ") + last;
  return Internal(std::move(m));
}
#endif

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

}  // namespace

bool NcclWindows::Supported(std::string* why) {
#if AGENTKV_NCCL_WINDOWS
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < NCCL_VERSION(2, 27, 0)) {
    if (why != nullptr)
      *why = "the NCCL library loaded (" + std::to_string(version) +
             ") predates symmetric windows (2.27)";
    return false;
  }
  return true;
#else
  if (why != nullptr)
    *why = NcclBuilt()
               ? "this agentkv was built with an NCCL older than 2.27 (no symmetric windows)"
               : "this agentkv was built without NCCL";
  return false;
#endif
}

Result<std::unique_ptr<NcclWindows>> NcclWindows::Create(const NcclComms& comms, size_t bytes) {
  std::string why;
  if (!Supported(&why)) return Unimplemented("NCCL symmetric windows: " + why);
  if (bytes == 0) return InvalidArgument("NCCL symmetric windows: 0 bytes");
#if AGENTKV_NCCL_WINDOWS
  const int n = comms.size();
  std::unique_ptr<NcclWindows> w(new NcclWindows());
  w->bytes_ = (bytes + kNcclWindowAlign - 1) / kNcclWindowAlign * kNcclWindowAlign;
  w->ptrs_.assign(n, nullptr);
  w->wins_.assign(n, nullptr);
  for (int r = 0; r < n; ++r) {
    w->devices_.push_back(comms.device(r));
    w->comms_.push_back(comms.comm(r));
  }
  DeviceGuard guard;
  for (int r = 0; r < n; ++r) {
    if (cudaSetDevice(w->devices_[r]) != cudaSuccess) {
      (void)cudaGetLastError();
      return Internal("NCCL symmetric windows: cudaSetDevice(" + std::to_string(w->devices_[r]) +
                      ") failed");  // (the destructor frees what was allocated)
    }
    if (const ncclResult_t e = ncclMemAlloc(&w->ptrs_[r], w->bytes_); e != ncclSuccess) {
      w->ptrs_[r] = nullptr;
      return NcclError(e, "ncclMemAlloc(" + std::to_string(w->bytes_) + ")");
    }
    // Graph steps' padding rows read what is there: never undefined.
    if (cudaMemset(w->ptrs_[r], 0, w->bytes_) != cudaSuccess) {
      (void)cudaGetLastError();
      return Internal("NCCL symmetric windows: cudaMemset failed");
    }
  }
  // One group: every rank's registration completes together. (Inside a
  // group NCCL fills the handles at ncclGroupEnd: they need addresses that
  // live until then.)
  std::vector<ncclWindow_t> wins(n, nullptr);
  ncclResult_t first = ncclGroupStart();
  for (int r = 0; r < n && first == ncclSuccess; ++r) {
    cudaSetDevice(w->devices_[r]);
    first = ncclCommWindowRegister(static_cast<ncclComm_t>(w->comms_[r]), w->ptrs_[r], w->bytes_,
                                   &wins[r], NCCL_WIN_COLL_SYMMETRIC);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (first == ncclSuccess) first = end;
  for (int r = 0; r < n; ++r) w->wins_[r] = wins[r];
  if (first != ncclSuccess) {
    // What registered is deregistered (best effort) and everything freed by
    // the destructor.
    return NcclError(first, "ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)");
  }
  return w;
#else
  (void)comms;
  return Unimplemented("NCCL symmetric windows: not built");
#endif
}

void NcclWindows::Release() {
#if AGENTKV_NCCL_WINDOWS
  DeviceGuard guard;
  bool any = false;
  for (void* win : wins_) any = any || win != nullptr;
  if (any) {
    ncclGroupStart();
    for (size_t r = 0; r < wins_.size(); ++r) {
      if (wins_[r] == nullptr) continue;
      cudaSetDevice(devices_[r]);
      ncclCommWindowDeregister(static_cast<ncclComm_t>(comms_[r]),
                               static_cast<ncclWindow_t>(wins_[r]));
    }
    ncclGroupEnd();
  }
  for (size_t r = 0; r < ptrs_.size(); ++r) {
    if (ptrs_[r] == nullptr) continue;
    cudaSetDevice(devices_[r]);
    ncclMemFree(ptrs_[r]);
  }
#endif
  wins_.clear();
  ptrs_.clear();
}

NcclWindows::~NcclWindows() { Release(); }

}  // namespace agentkv::backend::cuda
