// Drawing tokens on the device (sample_kernel.cu); launch.h says what all
// launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda::kernels {

// For each row r < rows with picks[r].mode == kDevice: out[r] = the token
// SampleDraw (engine/backend/sample_draw.h) draws from logits row r (vocab floats,
// rows contiguous) with picks[r].sample; other rows' out[r] are left as they
// are. One block of 512 threads per row; picks is a device array. The same
// token as the CPU's SampleDraw except where u * M, top_p's target or a
// weight against min_p lies within float rounding of a boundary (float
// expf here and there may differ by an ulp or two; sums run in double in
// another order).
cudaError_t LaunchSampleRows(const float* logits, int rows, int vocab, const RowPick* picks,
                             int32_t* out, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
