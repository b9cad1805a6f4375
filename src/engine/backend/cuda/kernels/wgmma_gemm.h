// The warpgroup (wgmma) GEMM of decode steps of 3 to 64 rows, plain, with
// the gated activation or the argmax in its epilogue, or leaving split-K
// planes (wgmma_gemm.cu; sm_90a). launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kernels/gemm_route.h"
#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// y[m][n] = x[m] . w[n] + beta * y[m][n] with Hopper warpgroup MMAs, for
// decode steps of up to kMaxWgmmaRows rows (x [m][k], w [n][k] bf16; y fp32
// or bf16; n a multiple of 64, k of 64). Compute capability 9.0 only (the
// kernel is built for sm_90a); launched with programmatic dependent launch,
// it requests its first weight stages before waiting on the kernel before
// it. K may be split over several blocks, whose partials are added in a
// fixed order: the result is deterministic.
// (kMaxWgmmaRows, WgmmaGemmSupported, WgmmaGemmPlan and WgmmaGemmPlanFor:
// gemm_route.h.)
// Device scratch of a split K: the blocks' partial tiles and a counter per
// tile. WgmmaGemmWorkspaceBytes(num_sms) of device memory, zeroed once
// before the first launch (each launch leaves the counters at zero). The
// launches that share one must run in stream order (one stream).
struct WgmmaGemmWorkspace {
  void* base = nullptr;
  int num_sms = 0;
};
size_t WgmmaGemmWorkspaceBytes(int num_sms);
// act < 0: y as above. act >= 0 (Activate's codes: 0 SiLU, 1 GELU-tanh):
// y bf16 [m][n / 2] = act(x . w[2i]) * (x . w[2i + 1]), the gated MLP's
// activation on weights whose gate and up rows are interleaved (beta 0).
// planes: y is fp32 [plan.splits][m][n], split s's partial product in
// plane s, not added up (beta 0; the workspace is not used): for
// LaunchAddPartsRmsNorm. Plans whose partial tiles exceed the workspace are
// refused (cudaErrorInvalidValue), as are other invalid arguments.
cudaError_t LaunchWgmmaGemm(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n,
                            int k, float beta, WgmmaGemmWorkspace ws, LaunchConfig launch,
                            int act = -1, bool planes = false, WgmmaGemmPlan plan = {});

// The LM head's form: y fp32 [m][n] = x . w^T (beta 0, no split), stored
// only when store_logits is null or the device int it points to is not 0
// (read when the kernel runs, so that one captured graph serves steps with
// and without rows that sample), and argmax[r] of each row as LaunchArgmax
// defines it, from the same fp32 values: each block's best per row into
// `scratch` (WgmmaArgmaxScratchBytes(m, n, plan)), then one pass over
// them. The logits cross memory once at most instead of being written and
// read back.
size_t WgmmaArgmaxScratchBytes(int m, int n, WgmmaGemmPlan plan = {});
cudaError_t LaunchWgmmaGemmArgmax(const bf16_t* x, const bf16_t* w, float* y,
                                  const int32_t* store_logits, int m, int n, int k, void* scratch,
                                  int32_t* argmax, int num_sms, LaunchConfig launch,
                                  WgmmaGemmPlan plan = {});

}  // namespace agentkv::backend::cuda::kernels
