#include "engine/backend/cuda/nccl_comms.h"

#include <algorithm>

#include "engine/backend/cuda/status.h"

#if AGENTKV_HAVE_NCCL
#include <nccl.h>

#define NCCL_RETURN_IF_ERROR(expr)                                                             \
  do {                                                                                         \
    const ncclResult_t agentkv_nccl_r_ = (expr);                                               \
    if (agentkv_nccl_r_ != ncclSuccess)                                                        \
      return ::agentkv::backend::cuda::NcclStatus(agentkv_nccl_r_, #expr, __FILE__, __LINE__); \
  } while (0)
#endif

namespace agentkv::backend::cuda {

#if AGENTKV_HAVE_NCCL
namespace {

// ncclResult_t as a Status naming the call, with NCCL's last error text.
Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line) {
  std::string m = std::string("NCCL error ") + ncclGetErrorString(r) + " in " + expr + " at " +
                  file + ":" + std::to_string(line);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    m += std::string(": ") + last;
  return Internal(std::move(m));
}

}  // namespace
#endif

bool NcclBuilt() { return AGENTKV_HAVE_NCCL != 0; }

int NcclLoadedVersion() {
#if AGENTKV_HAVE_NCCL
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
#else
  return 0;
#endif
}

int VisibleGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Status NcclRank::AllReduce(void* buf, size_t count, Op op, cudaStream_t stream) const {
  if (!active() || count == 0) return Status::Ok();
#if AGENTKV_HAVE_NCCL
  const ncclDataType_t type = op == Op::kSumF32    ? ncclFloat32
                              : op == Op::kSumBf16 ? ncclBfloat16
                                                   : ncclUint64;
  const ncclRedOp_t red = op == Op::kMaxU64 ? ncclMax : ncclSum;
  NCCL_RETURN_IF_ERROR(
      ncclAllReduce(buf, buf, count, type, red, static_cast<ncclComm_t>(comm_), stream));
  return Status::Ok();
#else
  (void)buf, (void)op, (void)stream;
  return Unimplemented("NCCL: this build has no NCCL");
#endif
}

Status NcclRank::SumF32(float* buf, size_t count, cudaStream_t stream) const {
  return AllReduce(buf, count, Op::kSumF32, stream);
}

Status NcclRank::SumBf16(void* buf, size_t count, cudaStream_t stream) const {
  return AllReduce(buf, count, Op::kSumBf16, stream);
}

Status NcclRank::MaxU64(uint64_t* buf, size_t count, cudaStream_t stream) const {
  return AllReduce(buf, count, Op::kMaxU64, stream);
}

Result<std::unique_ptr<NcclComms>> NcclComms::Create(std::span<const int> devices,
                                                     const NcclOptions& options) {
  if (options.nvls_enable.empty())
    return InvalidArgument(
        "NCCL: NCCL_NVLS_ENABLE is not settled (the command line sets it to 0 at start unless it "
        "is set): refusing to let NCCL choose NVLink multicast");
  if (devices.empty()) return InvalidArgument("NCCL: no devices");
  std::vector<int> sorted(devices.begin(), devices.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return InvalidArgument("NCCL: a device is named twice");
  const int visible = VisibleGpus();
  for (int d : devices)
    if (d < 0 || d >= visible)
      return InvalidArgument("NCCL: device " + std::to_string(d) + " is not one of the " +
                             std::to_string(visible) + " visible");
#if AGENTKV_HAVE_NCCL
  std::unique_ptr<NcclComms> c(new NcclComms());
  c->devices_.assign(devices.begin(), devices.end());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  NCCL_RETURN_IF_ERROR(
      ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), c->devices_.data()));
  c->comms_.assign(comms.begin(), comms.end());
  return c;
#else
  return Unimplemented(
      "tensor parallelism needs NCCL, and this agentkv was built without it (no libnccl and "
      "nccl.h beside the CUDA toolkit at configure time; install NCCL's development package "
      "and rebuild)");
#endif
}

NcclComms::~NcclComms() {
#if AGENTKV_HAVE_NCCL
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (comms_[i] == nullptr) continue;
    cudaSetDevice(devices_[i]);
    ncclCommDestroy(static_cast<ncclComm_t>(comms_[i]));
  }
#endif
}

}  // namespace agentkv::backend::cuda
