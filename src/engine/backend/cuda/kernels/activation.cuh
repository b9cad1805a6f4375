// The gated MLP's activation, for the kernels that apply it (the gated
// activation kernel and the GEMVs and GEMMs that fuse it into their
// epilogues). The formulas are gated_act.h's, shared with the MoE and fp8
// kernels' gated epilogues.
#pragma once

#include "engine/backend/cuda/kernels/gated_act.h"

namespace agentkv::backend::cuda::kernels {

// act 0: SiLU; 1: GELU, tanh approximation.
__device__ __forceinline__ float Activate(float x, int act) {
  return act == 0 ? Silu(x) : GeluTanh(x);
}

}  // namespace agentkv::backend::cuda::kernels
