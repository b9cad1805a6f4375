// The weight-streaming GEMVs of decode steps of one to eight rows, some
// with the RMSNorm before them or the gated activation after them fused in
// (gemv.cu). launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/gemm_route.h"
#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// y[m][n] = x[m] . w[n] + beta * y[m][n] (x [m][k], w [n][k] bf16; y fp32
// or bf16) for decode steps of at most kMaxGemvRows rows; k a multiple of 8
// and m * k * 2 <= 32 KiB (GemvSupported). num_sms sizes the grid. pipe:
// k of 8,192 or more on the pipelined kernel (CudaTuning::gemv_pipe; false:
// the plain one, for comparison).
cudaError_t LaunchGemv(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n, int k,
                       float beta, int num_sms, LaunchConfig launch, bool pipe = true);

// y[m][n] = RmsNorm(x[m], norm_w) . w[n] + beta * y[m][n] with x fp32 [m][k]
// (the residual stream), normalised as LaunchRmsNorm does, in one kernel;
// for m <= kMaxNormGemvRows and k <= 4096 (x is held in registers).
cudaError_t LaunchNormGemv(const float* x, const float* norm_w, float eps, bool plus_one,
                           const bf16_t* w, void* y, bool y_f32, int m, int n, int k, float beta,
                           LaunchConfig launch);

// out[m][i] = act(x[m] . w[2i]) * (x[m] . w[2i + 1]), bf16 [m][n / 2]: the
// gate_up GEMV with the gated activation in its epilogue (w's rows gate and
// up interleaved, as LaunchGatedAct reads them); for m <= kMaxGemvActRows,
// n even. One kernel less per layer for one- and two-row decode steps.
cudaError_t LaunchGemvGatedAct(const bf16_t* x, const bf16_t* w, bf16_t* out, int m, int n, int k,
                               int act, LaunchConfig launch);

// out = act(gate) * up of RmsNorm(x[m], norm_w) . w, as LaunchRmsNorm then
// LaunchGemvGatedAct, in one kernel (x fp32 [m][k]); for m <= kMaxNormGemvRows,
// k <= 4096, n even. A pipelined kernel: the backend launches the two
// kernels instead where CudaTuning::gemv_pipe is off.
cudaError_t LaunchNormGemvGatedAct(const float* x, const float* norm_w, float eps, bool plus_one,
                                   const bf16_t* w, bf16_t* out, int m, int n, int k, int act,
                                   LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
