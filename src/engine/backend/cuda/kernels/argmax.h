// The two-pass argmax (argmax.cu); launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// out[r] = argmax of row r (cols floats): lowest index on ties, NaN never wins,
// 0 when nothing beats -inf.
// In two passes: kArgmaxChunks blocks per row, then one per row; `scratch`
// holds ArgmaxScratchBytes(rows) of device memory.
inline constexpr int kArgmaxChunks = 64;
inline constexpr size_t ArgmaxScratchBytes(int rows) {
  return static_cast<size_t>(rows) * kArgmaxChunks * 8;
}
cudaError_t LaunchArgmax(const float* x, int rows, int cols, int32_t* out, void* scratch,
                         LaunchConfig launch);
// LaunchArgmax's second pass alone: out[r] from the (value, index as int
// bits) float2 pairs parts[r][chunks], the bests of a row's chunks.
cudaError_t LaunchArgmaxOfParts(const void* parts, int rows, int chunks, int32_t* out,
                                LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
