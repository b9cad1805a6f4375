// Logprobs next to the picks (logprob_kernel.cu); launch.h says what all
// launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/row_logprobs.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda::kernels {

// How many slices of a row LaunchRowLogprobs splits the work of one row
// into (each slice one block): about 4,096 logits a slice, 1 to 32. A row
// read by one block leaves the rest of the GPU idle and waits on its loads
// one after another (a 128k row: some 500 dependent iterations a thread
// and pass); 32 blocks a row keep 32 SMs busy at one row and still fill
// the GPU at 64.
int RowLogprobsSlices(int vocab);

// Device scratch LaunchRowLogprobs needs for `rows` rows of `vocab` logits:
// one partial result per slice of each row.
size_t RowLogprobsScratchBytes(int rows, int vocab);

// For each row r < rows whose picks[r] is kGreedy or kDevice with
// picks[r].logprobs >= 0: out[r] = ComputeRowLogprobs (row_logprobs.h) of
// logits row r (vocab floats, rows contiguous) with scale 1 / temperature
// for kDevice and 1 for kGreedy, want = picks[r].logprobs, and the chosen
// token chosen[r] (the pick kernels' output, so launch after them on the
// same stream). Other rows' out[r] are left as they are. Two kernels: one
// block of 256 threads per slice of a row (RowLogprobsSlices) finds the
// slice's max, its sum of exponentials relative to that max (double) and
// its top entries; then one warp per row merges the slices. `scratch`
// holds RowLogprobsScratchBytes(rows, vocab) bytes of device memory, not
// used by anything else until the launches have run (steps on one stream
// may share it). picks, chosen and out are device arrays. Matches the CPU
// reference up to the order of the double sums (|lse| within ~1e-12
// relative) and float rounding of the outputs; the top entries are the
// same ids in the same order.
cudaError_t LaunchRowLogprobs(const float* logits, int rows, int vocab, const RowPick* picks,
                              const int32_t* chosen, RowLogprobs* out, void* scratch,
                              LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
