// The gated MLP's activation, for the kernels that apply it (the gated
// activation kernel and the GEMV that fuses it into its epilogue).
#pragma once

namespace agentkv::backend::cuda::kernels {

// act 0: SiLU; 1: GELU, tanh approximation.
__device__ __forceinline__ float Activate(float x, int act) {
  if (act == 0) return x / (1.0f + expf(-x));
  const float c = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

}  // namespace agentkv::backend::cuda::kernels
