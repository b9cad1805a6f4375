// Hopper (sm_90) building blocks shared by the warpgroup kernels
// (cuda_wgmma_*.cu): the K-major operand descriptor of a 128-byte swizzled
// tile, the mbarrier operations their TMA pipelines wait on, and (host) the
// driver's tensor-map encoder, found through the runtime so that nothing
// links libcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace agentkv::backend::cuda::kernels {

// A K-major operand of 64 rows x 16 k at `saddr` (inside a 1024-byte
// aligned tile of 128-byte rows, 128-byte swizzle, as TMA or the GEMMs'
// cp.async copies lay it out): 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t KMajorDesc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr >> 4) & 0x3FFF) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// An mbarrier at shared address `bar` completing a phase after `count`
// arrivals (and the bytes announced by MbarExpectTx).
__device__ __forceinline__ void MbarInit(uint32_t bar, int count = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// One arrival that also announces `bytes` of asynchronous copies.
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Until the phase of the given parity has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "AGENTKV_MBAR_WAIT%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra AGENTKV_MBAR_WAIT%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// cuTensorMapEncodeTiled, or null where the driver has none.
using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                      const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                      const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                      CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline TensorMapEncoder TensorMapEncode() {
  static const TensorMapEncoder encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<TensorMapEncoder>(nullptr);
    return reinterpret_cast<TensorMapEncoder>(fn);
  }();
  return encode;
}

}  // namespace agentkv::backend::cuda::kernels
