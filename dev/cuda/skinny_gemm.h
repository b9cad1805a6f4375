// The skinny tensor-core GEMM (skinny_gemm.cu), kept as an experiment
// (dev/cuda/README.md). Launchers as in
// src/engine/backend/cuda/kernels/launch.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda {

// y[m][n] = x[m] . w[n] + beta * y[m][n] on the tensor cores, for decode
// steps of up to kMaxSkinnyRows rows (x [m][k], w [n][k] bf16; y fp32 or
// bf16; k a multiple of 128): the weights are streamed once. When the tiles
// of 128 features are too few for the GPU, K is split across
// SkinnyGemmSplits blocks of a cluster (sm_90), whose partials are added in
// a fixed order: the result is deterministic.
inline constexpr int kMaxSkinnyRows = 8;
bool SkinnyGemmSupported(int m, int n, int k);
int SkinnyGemmSplits(int n, int k, int num_sms);
// splits: 0 for SkinnyGemmSplits, else a power of two up to 8 (for
// measurements).
cudaError_t LaunchSkinnyGemm(const kernels::bf16_t* x, const kernels::bf16_t* w, void* y,
                             bool y_f32, int m, int n, int k, float beta, int num_sms,
                             kernels::LaunchConfig launch, int splits = 0);

}  // namespace agentkv::backend::cuda
