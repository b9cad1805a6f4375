// The persistent TMA warpgroup GEMM of prompt steps, with the gated
// activation or the argmax in its epilogue (wgmma_prompt_gemm.cu;
// sm_90a). launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kernels/gemm_route.h"
#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// y = x . w^T for prompt steps (x [m][k], w [n][k] bf16; y bf16 [m][n]),
// compute-bound: a persistent warp-specialised kernel with TMA loads and
// 128 x 256 warpgroup tiles (wgmma_prompt_gemm.cu). act >= 0
// (Activate's codes): y [m][n / 2] = act(x . w[2i]) * (x . w[2i + 1]), the
// gated activation in the epilogue (rows gate and up interleaved, as
// LaunchGatedAct reads them), from the fp32 products. Needs compute
// capability 9.0 (PromptGemmDeviceSupported, which asks the runtime about
// the current device: the backend asks once), n a multiple of 256 and k of
// 64 (PromptGemmShapeSupported, gemm_route.h; the launchers refuse other
// shapes); x, w and y 16-byte aligned. num_sms sizes the grid.
bool PromptGemmDeviceSupported();
// Both of the above (tests and benchmarks).
bool PromptGemmSupported(int m, int n, int k);
cudaError_t LaunchPromptGemm(const bf16_t* x, const bf16_t* w, bf16_t* y, int m, int n, int k,
                             int act, int num_sms, LaunchConfig launch);
// The LM head's form (as LaunchWgmmaGemmArgmax, any m): y fp32 [m][n]
// stored unless store_logits points to a device 0, and argmax[r] of each
// row as LaunchArgmax defines it, through `scratch`
// (PromptArgmaxScratchBytes) and LaunchArgmaxOfParts.
size_t PromptArgmaxScratchBytes(int m, int n);
cudaError_t LaunchPromptGemmArgmax(const bf16_t* x, const bf16_t* w, float* y,
                                   const int32_t* store_logits, int m, int n, int k, void* scratch,
                                   int32_t* argmax, int num_sms, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
