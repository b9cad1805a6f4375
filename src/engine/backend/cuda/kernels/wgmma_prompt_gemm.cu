// Hopper warpgroup GEMM for prompt-sized products: y = x . w^T with x
// [m][k] (the step's tokens) and w [n][k] bf16, near the tensor cores'
// rate, carrying in its epilogue what cuBLAS cannot: the gated MLP's
// activation (gate and up weight rows interleaved, as LaunchGatedAct reads
// them: gate_up writes act(gate) * up, and the activation kernel's ~130 us
// a layer of an 8,192-token step goes, bench/RESULTS.md item 96) and the LM
// head's argmax (each row's best feature a tile; item 98). Also plain bf16
// out. (Its fp32 residual form lost to cuBLAS: dev/cuda/prompt_gemm_add.cu
// instantiates it from wgmma_prompt_gemm.cuh.)
//
// Structure (persistent, warp-specialised): one block an SM takes output
// tiles of 128 tokens x 256 features in turn. Warpgroup 0's first thread
// requests each stage (64 k of the x tile and of the weight tile) by TMA
// into a ring of four, completing on the stage's "full" mbarrier;
// warpgroups 1 and 2 each multiply 64 of the tile's rows by the 256
// features (wgmma m64n256k16, accumulators in registers) and release a
// stage on its "empty" mbarrier once their MMAs have read it. The result
// goes through a swizzled shared-memory tile and out by TMA stores, which
// run while the consumers start on the next tile (whose first stages have
// streamed in during the epilogue). Measured: gate_up with its activation
// 784-804 us at 8,192 rows against 887-913 for cuBLAS and the activation
// kernel; the LM head at 64 rows 178 us against 207 for the warpgroup GEMM.
// Tiles go out in bands of 8 feature tiles, the token tiles fastest within
// a band, so that the blocks running at once share their weights in L2.
//
// Built for sm_90a only; the backend calls it on compute capability 9.0.
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.cuh"

#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.h"

namespace agentkv::backend::cuda::kernels {

bool PromptGemmDeviceSupported() {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
         major == 9 && minor == 0 && TensorMapEncode() != nullptr;
}

bool PromptGemmSupported(int m, int n, int k) {
  return PromptGemmShapeSupported(m, n, k) && PromptGemmDeviceSupported();
}

cudaError_t LaunchPromptGemm(const bf16_t* x, const bf16_t* w, bf16_t* y, int m, int n, int k,
                             int act, int num_sms, LaunchConfig launch) {
  if (!PromptGemmShapeSupported(m, n, k) || num_sms <= 0 || act > 1) return cudaErrorInvalidValue;
  CUtensorMap xm, wm, ym;
  if (!Map2d(x, m, k, kBM, &xm) || !Map2d(w, n, k, kBN, &wm) ||
      !Map2d(y, m, act >= 0 ? n / 2 : n, kBM, &ym))
    return cudaErrorInvalidValue;
  const PromptArgs a = ArgsOf(m, n, k, act);
  return act >= 0 ? LaunchKernel<Out::kGated>(xm, wm, ym, a, num_sms, launch)
                  : LaunchKernel<Out::kBf16>(xm, wm, ym, a, num_sms, launch);
}

size_t PromptArgmaxScratchBytes(int m, int n) {
  return static_cast<size_t>(m) * (n / kBN) * sizeof(float2);
}

cudaError_t LaunchPromptGemmArgmax(const bf16_t* x, const bf16_t* w, float* y,
                                   const int32_t* store_logits, int m, int n, int k, void* scratch,
                                   int32_t* argmax, int num_sms, LaunchConfig launch) {
  if (!PromptGemmShapeSupported(m, n, k) || num_sms <= 0 || scratch == nullptr || argmax == nullptr)
    return cudaErrorInvalidValue;
  CUtensorMap xm, wm, ym;
  if (!Map2d(x, m, k, kBM, &xm) || !Map2d(w, n, k, kBN, &wm) || !Map2d(y, m, n, kBM, &ym, true))
    return cudaErrorInvalidValue;
  PromptArgs a = ArgsOf(m, n, k, -1);
  a.best = static_cast<float2*>(scratch);
  a.store = store_logits;
  const cudaError_t e = LaunchKernel<Out::kArgmax>(xm, wm, ym, a, num_sms, launch);
  if (e != cudaSuccess) return e;
  return LaunchArgmaxOfParts(scratch, m, n / kBN, argmax, launch);
}

}  // namespace agentkv::backend::cuda::kernels
