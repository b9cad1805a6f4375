#include "engine/backend/cuda/nccl_comms.h"

#include <algorithm>

#include "engine/backend/cuda/status.h"

namespace agentkv::cuda {

Status NcclStatus(ncclResult_t r, const char* expr, const char* file, int line) {
  std::string m = std::string("NCCL error ") + ncclGetErrorString(r) + " in " + expr + " at " +
                  file + ":" + std::to_string(line);
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && *last != '\0')
    m += std::string(": ") + last;
  return Internal(std::move(m));
}

int VisibleGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Status NcclRank::AllReduce(void* buf, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           cudaStream_t stream) const {
  if (!active() || count == 0) return Status::Ok();
  NCCL_RETURN_IF_ERROR(ncclAllReduce(buf, buf, count, type, op, comm_, stream));
  return Status::Ok();
}

Status NcclRank::SumF32(float* buf, size_t count, cudaStream_t stream) const {
  return AllReduce(buf, count, ncclFloat32, ncclSum, stream);
}

Status NcclRank::SumBf16(void* buf, size_t count, cudaStream_t stream) const {
  return AllReduce(buf, count, ncclBfloat16, ncclSum, stream);
}

Status NcclRank::MaxU64(uint64_t* buf, size_t count, cudaStream_t stream) const {
  return AllReduce(buf, count, ncclUint64, ncclMax, stream);
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
  std::unique_ptr<NcclComms> c(new NcclComms());
  c->devices_.assign(devices.begin(), devices.end());
  c->comms_.assign(devices.size(), nullptr);
  NCCL_RETURN_IF_ERROR(
      ncclCommInitAll(c->comms_.data(), static_cast<int>(devices.size()), c->devices_.data()));
  return c;
}

NcclComms::~NcclComms() {
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (comms_[i] == nullptr) continue;
    cudaSetDevice(devices_[i]);
    ncclCommDestroy(comms_[i]);
  }
}

}  // namespace agentkv::cuda
