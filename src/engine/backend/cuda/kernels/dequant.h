// Quantized weight matrices dequantized to bf16 in device memory
// (dequant.cu), for steps of many tokens: the backend dequantizes one
// projection into a scratch buffer and runs the bf16 GEMMs on it
// (cuda/gemm_plan.h's UseDequantGemm says when). Each value is
// bf16_rn(float(code) * scale): what the quantized tiles of moe.cu stage
// in shared memory (QuantStore), so both paths multiply the same bf16
// weights. The CPU decoders these agree with are engine/model/quant_format.h's
// (E4m3ToF32, Fp4ToF32, E8m0ToF32). launch.h says what all launchers share;
// both launch with programmatic dependent launch and wait before any access
// to memory (the scratch they write is read by the kernel before them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// Values a thread converts: one 16-byte load of fp8 codes (and two of
// mxfp4 nibbles, one 32-value block).
inline constexpr int kDequantFp8Vec = 16;
inline constexpr int kDequantMxfp4Block = 32;

// Whether LaunchDequantFp8 takes the shape: k a multiple of 16, block_cols
// of 16 (so that 16 values share one scale), n and k positive.
inline bool DequantFp8Supported(int n, int k, int block_cols) {
  return n > 0 && k > 0 && k % kDequantFp8Vec == 0 && block_cols > 0 &&
         block_cols % kDequantFp8Vec == 0;
}

// out [n][k] bf16 = e4m3(codes[r][c]) * scales[r][c / block_cols], codes
// [n][k] (one byte a value), scales [n][ceil(k / block_cols)] fp32 (a scale
// per row and block of columns: CudaBackend's QuantDense layout). NaN codes
// give NaN. Shapes DequantFp8Supported refuses: cudaErrorInvalidValue.
cudaError_t LaunchDequantFp8(const uint8_t* codes, const float* scales, int n, int k,
                             int block_cols, bf16_t* out, LaunchConfig launch);

// out [n][k] bf16 = e2m1(nibble) * 2^(exps[r][c / 32] - 127): blocks [n][k
// / 2] bytes (two values a byte, the low nibble first), exps [n][k / 32]
// (E8M0; 255 is NaN). k a multiple of 32, else cudaErrorInvalidValue.
cudaError_t LaunchDequantMxfp4(const uint8_t* blocks, const uint8_t* exps, int n, int k,
                               bf16_t* out, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
