// Element-wise launchers (elementwise.cu): softcap, bf16 conversions,
// fill. launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// x = cap * tanh(x / cap) over n floats.
cudaError_t LaunchSoftcap(float* x, int64_t n, float cap, LaunchConfig launch);

// fp32 -> bf16 (round to nearest even), and back.
cudaError_t LaunchF32ToBf16(const float* in, bf16_t* out, int64_t n, LaunchConfig launch);
cudaError_t LaunchBf16ToF32(const bf16_t* in, float* out, int64_t n, LaunchConfig launch);

// Fills n floats with `value` (tests poison outputs with NaN).
cudaError_t LaunchFill(float* x, int64_t n, float value, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
