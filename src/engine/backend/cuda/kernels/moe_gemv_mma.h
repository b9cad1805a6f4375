// The quantized form of the grouped GEMM's weight-streaming path
// (moe_gemv_mma.cu): LaunchMoeGemv (moe_gemv.cu) checks the parameters and
// sends fp8 block and mxfp4 weights here. Internal to the kernels folder.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/moe.h"

namespace agentkv::backend::cuda::kernels {

// p as LaunchMoeGemv takes it, already checked (format kFp8Block or
// kMxfp4, MoeGemvTakes' shapes); `tiles`: the grid's row tiles (max_tiles,
// or the one group's). cudaErrorInvalidValue for bf16.
cudaError_t LaunchMoeGemvMma(const MoeGemmParams& p, int tiles, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
