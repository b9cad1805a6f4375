// The residual form of the persistent warpgroup prompt GEMM
// (src/engine/backend/cuda/kernels/wgmma_prompt_gemm.cuh, whose kernel this
// file instantiates): y fp32 [m][n] += x . w^T, each output tile added into y by
// a TMA reduction (one add an element: deterministic) while the kernel goes
// on. Measured 0-7% slower than cuBLAS for the o and down projections, so
// the product never used it (dev/cuda/README.md). Built for sm_90a only.
#include "dev/cuda/prompt_gemm_add.h"
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.cuh"
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.h"

namespace agentkv::backend::cuda::dev {

bool PromptGemmAddSupported(int m, int n, int k) { return kernels::PromptGemmSupported(m, n, k); }

cudaError_t LaunchPromptGemmAdd(const kernels::bf16_t* x, const kernels::bf16_t* w, float* y, int m,
                                int n, int k, int num_sms, kernels::LaunchConfig launch) {
  if (!PromptGemmAddSupported(m, n, k) || num_sms <= 0) return cudaErrorInvalidValue;
  using namespace kernels;  // the kernel's plumbing (wgmma_prompt_gemm.cuh)
  CUtensorMap xm, wm, ym;
  if (!Map2d(x, m, k, kBM, &xm) || !Map2d(w, n, k, kBN, &wm) || !Map2d(y, m, n, kBM, &ym, true))
    return cudaErrorInvalidValue;
  const PromptArgs a = ArgsOf(m, n, k, -1);
  return LaunchKernel<Out::kAddF32>(xm, wm, ym, a, num_sms, launch);
}

}  // namespace agentkv::backend::cuda::dev
