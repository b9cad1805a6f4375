// The embedding and RMSNorm launchers (norm.cu); launch.h says what all
// launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/gemm_route.h"
#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// x[t] = embed[tokens[t]] * scale (fp32 out), rows of `dim`. A negative
// tokens[t] stands for picks[-1 - tokens[t]] (the previous step's greedy
// pick, still on the device).
cudaError_t LaunchEmbed(const bf16_t* embed, const int32_t* tokens, const int32_t* picks, int rows,
                        int dim, float scale, float* x, LaunchConfig launch);

// out[r] = x[rows_idx ? rows_idx[r] : r] / rms * w (or (1 + w)) as bf16.
cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows_idx, const float* w, bf16_t* out,
                          int rows, int dim, float eps, bool plus_one, LaunchConfig launch);

// LaunchRmsNorm after a residual add: x[src] += parts[0][src] + ... +
// parts[nparts - 1][src] (planes `plane` floats apart, rows of dim; added in
// plane order, deterministic), written back to x, then out[r] = the norm of
// it (src = rows_idx ? rows_idx[r] : r). The planes are a split-K GEMM's
// partial outputs (LaunchWgmmaGemm with planes). Requires
// AddPartsRmsNormSupported(dim, nparts).
cudaError_t LaunchAddPartsRmsNorm(float* x, const float* parts, int nparts, int64_t plane,
                                  const int32_t* rows_idx, const float* w, bf16_t* out, int rows,
                                  int dim, float eps, bool plus_one, LaunchConfig launch);

// Gemma 3 sandwich: x += norm(o, w_post); then h = norm(x, w_pre) (skipped
// when w_pre is null).
cudaError_t LaunchAddNormed(const float* o, const float* w_post, float* x, const float* w_pre,
                            bf16_t* h, int rows, int dim, float eps, bool plus_one,
                            LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
