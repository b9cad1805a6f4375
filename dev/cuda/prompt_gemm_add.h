// The persistent prompt GEMM's residual form (prompt_gemm_add.cu), kept as
// an experiment (dev/cuda/README.md). Launchers as in
// src/engine/backend/cuda/kernels/launch.h.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::dev {

// y fp32 [m][n] += x . w^T (x [m][k], w [n][k] bf16), each tile added by a
// TMA reduction (one add an element: deterministic) while the kernel goes
// on. Needs compute capability 9.0, n a multiple of 256 and k of 64
// (PromptGemmAddSupported); x, w and y 16-byte aligned. num_sms sizes the
// grid.
bool PromptGemmAddSupported(int m, int n, int k);
cudaError_t LaunchPromptGemmAdd(const kernels::bf16_t* x, const kernels::bf16_t* w, float* y, int m,
                                int n, int k, int num_sms, kernels::LaunchConfig launch);

}  // namespace agentkv::backend::cuda::dev
