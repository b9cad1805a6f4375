// Programmatic dependent launch (Hopper): a kernel launched with LaunchPdl
// may be scheduled while the kernel before it on the stream is still
// running, so that its blocks are resident, and can prefetch what does not
// depend on that kernel (weights), when the earlier kernel finishes; the
// launch gap between the ~200 small kernels of a decode step shrinks.
//
// Contract for a kernel launched through LaunchPdl: it calls PdlWait()
// before it reads or writes any memory an earlier kernel of the stream
// writes or reads (activations, caches, metadata); before that it may read
// only memory no kernel of the step writes (weights, constants). It may
// call PdlLaunchDependents() as early as it likes: the next kernel still
// waits in its own PdlWait for this one to finish and its writes to show.
//
// A LaunchConfig with pdl off (launch.h; CudaTuning::pdl) launches plainly
// (for comparison). Devices before sm_90 have no such launches: the
// instructions compile to nothing and the attribute is not set.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the current device has programmatic dependent launch (sm_90 or
// newer; asked once per process: a property of the hardware, not a switch).
bool PdlSupported();

// LaunchPdl for a kernel whose blocks form clusters of cluster_y blocks
// along y (1: no clusters).
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdlClustered(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                               int cluster_y, const LaunchConfig& launch, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = launch.stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster_y > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = cluster_y;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (launch.pdl && PdlSupported()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      const LaunchConfig& launch, Args&&... args) {
  return LaunchPdlClustered(kernel, grid, block, smem, 1, launch, std::forward<Args>(args)...);
}

// A bare stream would launch with pdl on whatever the caller was given:
// launchers pass their LaunchConfig on.
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdlClustered(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                               int cluster_y, cudaStream_t stream, Args&&... args) = delete;
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) = delete;

}  // namespace agentkv::backend::cuda::kernels
