// Logprobs next to the picks (logprob_kernel.cu); launch.h says what all
// launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/row_logprobs.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda::kernels {

// For each row r < rows whose picks[r] is kGreedy or kDevice with
// picks[r].logprobs >= 0: out[r] = ComputeRowLogprobs (row_logprobs.h) of
// logits row r (vocab floats, rows contiguous) with scale 1 / temperature
// for kDevice and 1 for kGreedy, want = picks[r].logprobs, and the chosen
// token chosen[r] (the pick kernels' output, so launch after them on the
// same stream). Other rows' out[r] are left as they are. One block of 256
// threads per row, two passes over the row. picks, chosen and out are
// device arrays. Matches the CPU reference up to the order of the double
// sums (|lse| within ~1e-12 relative) and float rounding of the outputs;
// the top entries are the same ids in the same order.
cudaError_t LaunchRowLogprobs(const float* logits, int rows, int vocab, const RowPick* picks,
                              const int32_t* chosen, RowLogprobs* out, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
