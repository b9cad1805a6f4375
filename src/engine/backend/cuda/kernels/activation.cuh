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

// The experts' gated product of gate and up: SwiGLU, or with `clamped` the
// GPT-OSS form (gate clamped above, up to +-limit, sigmoid of 1.702 gate,
// up + 1), as the CPU backend's MoE reference computes it.
__device__ __forceinline__ float GatedExpert(float gate, float up, bool clamped, float limit) {
  if (!clamped) return gate / (1.f + expf(-gate)) * up;
  gate = fminf(gate, limit);
  up = fminf(fmaxf(up, -limit), limit);
  return (up + 1.f) * gate / (1.f + expf(-1.702f * gate));
}

}  // namespace agentkv::backend::cuda::kernels
