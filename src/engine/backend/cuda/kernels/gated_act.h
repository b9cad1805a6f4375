// The gated MLP's product of a gate and an up value, as functions of host
// and device (compiled by nvcc for the kernels, by the host compiler for
// tests that need no GPU and no CUDA toolkit). Every kernel that applies a
// gated activation computes it with these (activation.cuh's Activate for
// the bf16 paths, the MoE kernels' gated epilogues for experts and fp8
// dense projections), so a gated form is one formula on every path; the
// CPU backend's references (cpu_kernels.h GatedActivation, the MoE
// reference's expert) compute the same in fp32, which the host tests pin.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define AGENTKV_GATED_HD __host__ __device__
#else
#define AGENTKV_GATED_HD
#endif

namespace agentkv::backend::cuda::kernels {

// How gate g and up u make one output.
enum class GatedForm : uint8_t {
  kSwiglu,         // silu(g) * u (Llama, Qwen, Mistral, Qwen3-MoE experts)
  kClampedSwiglu,  // GPT-OSS: g = min(g, limit), u = clamp(u, -limit, limit),
                   // (u + 1) * g * sigmoid(1.702 g)
  kGeluTanh,       // gelu(g) * u with GELU's tanh approximation (Gemma 3:
                   // hidden_activation gelu_pytorch_tanh)
};

// x * sigmoid(x).
AGENTKV_GATED_HD inline float Silu(float x) { return x / (1.0f + expf(-x)); }

// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
AGENTKV_GATED_HD inline float GeluTanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// `limit`: kClampedSwiglu's clamp (ignored by the other forms).
AGENTKV_GATED_HD inline float GatedProduct(float gate, float up, GatedForm form, float limit) {
  switch (form) {
    case GatedForm::kClampedSwiglu:
      gate = fminf(gate, limit);
      up = fminf(fmaxf(up, -limit), limit);
      return (up + 1.f) * gate / (1.f + expf(-1.702f * gate));
    case GatedForm::kGeluTanh:
      return GeluTanh(gate) * up;
    default:
      return Silu(gate) * up;
  }
}

}  // namespace agentkv::backend::cuda::kernels
