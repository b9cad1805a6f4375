// The gated activation launcher (activation.cu); launch.h says what all
// launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// out[r][i] = act(gate_up[r][2i]) * gate_up[r][2i + 1]: rows of 2n with
// gate and up interleaved, as the backend uploads the two weights' rows
// (so that a GEMV block holds both halves of its outputs; see
// LaunchGemvGatedAct). bf16 in and out. act: 0 SiLU, 1 GELU (tanh).
cudaError_t LaunchGatedAct(const bf16_t* gate_up, bf16_t* out, int rows, int n, int act,
                           LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
