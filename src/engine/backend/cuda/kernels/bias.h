// Adding a bias vector to fp32 rows (bias.cu): the o projection's bias
// (GPT-OSS), added to the residual stream after the GEMM that has no
// epilogue for it. launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// x[r][c] += bias[c] for `rows` rows of `cols` floats. The residual's
// split-K planes (if any are pending) may be added before or after: the
// sum is the same.
cudaError_t LaunchAddRowBias(float* x, const float* bias, int64_t rows, int cols,
                             LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
