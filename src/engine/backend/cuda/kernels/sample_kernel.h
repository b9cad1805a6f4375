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
// are. A cluster of `cluster` blocks of 512 threads per row (1 to 8; 0:
// SampleClusterSize's choice for this device; more than 1 needs sm_90 or
// later and a build for it, else cudaErrorNotSupported, and more than 8
// gives cudaErrorInvalidValue); picks is a device array.
// The same token as the CPU's SampleDraw except where u * M, top_p's target
// or a weight against min_p lies within float rounding of a boundary (float
// expf here and there may differ by an ulp or two; the draw's sums run in
// double in another order, top_p's in fixed point of 2^-42, exact and
// order-independent, so at most vocab * 2^-43 off the true sum). Same
// inputs and cluster size, same picks on every launch.
cudaError_t LaunchSampleRows(const float* logits, int rows, int vocab, const RowPick* picks,
                             int32_t* out, LaunchConfig launch, int cluster = 0);

// Blocks per row for `rows` rows on a device of `sms` SMs and compute
// capability major `cc_major`: the largest power of two up to 8 with rows *
// blocks <= sms, so that a step's rows spread over the SMs (at least 1;
// always 1 before Hopper, which has no clusters).
int SampleClusterSize(int rows, int sms, int cc_major);

}  // namespace agentkv::backend::cuda::kernels
