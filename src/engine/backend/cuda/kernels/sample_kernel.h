// Drawing tokens on the device (sample_kernel.cu); launch.h says what all
// launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/sample_search.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda::kernels {

// For each row r < rows with picks[r].mode == kDevice: out[r] = the token
// SampleDraw (engine/backend/sample_draw.h) draws from logits row r (vocab
// floats, rows contiguous) with picks[r].sample, or with picks[r].draft >= 0
// gives the token VerifyDraftRow (same header) gives (the draft token if
// accepted with picks[r].u_accept, else the residual draw); other rows'
// out[r] are left as they are. picks is a device array. A cluster of
// `cluster` blocks of 512 threads per row: 1 to 8, or 0 for
// SampleClusterSize's choice (sample_search.h) on this device; more than 1
// needs sm_90 or later and a build for it (else cudaErrorNotSupported),
// more than 8 gives cudaErrorInvalidValue. The same token as the CPU's
// SampleDraw / VerifyDraftRow except where u * M, u_accept against the
// draft's share, top_p's target or a weight against min_p lies within float
// rounding of a boundary (float expf here and there may differ by an ulp or
// two; the draw's sums run in double in another order, top_p's in fixed
// point of 2^-42, exact and order-independent, so at most vocab * 2^-43 off
// the true sum). Same inputs and cluster size, same picks on every launch.
cudaError_t LaunchSampleRows(const float* logits, int rows, int vocab, const RowPick* picks,
                             int32_t* out, LaunchConfig launch, int cluster = 0);

}  // namespace agentkv::backend::cuda::kernels
