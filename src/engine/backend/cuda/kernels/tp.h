// Kernels of tensor parallelism (docs/tensor-parallel.md): a rank's
// embedding over its vocabulary slice, the argmax keys that one max
// all-reduce combines into the global greedy picks (tp_combine.h), and the
// fence before an all-reduce from a symmetric window (tp_reduce_plan.h).
// launch.h says what all launchers share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"

namespace agentkv::backend::cuda::kernels {

// LaunchEmbed over a vocabulary slice: x[t] = embed[tok - vocab_begin] *
// scale where tok (tokens[t], or for a negative one picks[-1 - tok], a
// global id) lies in [vocab_begin, vocab_begin + vocab_count), else zeros;
// embed holds the slice's rows. Summed over the ranks: the full embedding.
cudaError_t LaunchEmbedShard(const bf16_t* embed, const int32_t* tokens, const int32_t* picks,
                             int rows, int dim, float scale, int64_t vocab_begin,
                             int64_t vocab_count, float* x, LaunchConfig launch);

// keys[r] = tp::ArgmaxKey(logits[r][picks[r]], vocab_begin + picks[r]):
// each row's local argmax (picks, over the slice's `vocab` columns) as a
// key whose max over the ranks is the global argmax.
cudaError_t LaunchArgmaxKeys(const float* logits, int64_t vocab, const int32_t* picks, int rows,
                             int64_t vocab_begin, uint64_t* keys, LaunchConfig launch);

// picks[r] = tp::ArgmaxKeyId(keys[r]) (global ids).
cudaError_t LaunchKeysToPicks(const uint64_t* keys, int rows, int32_t* picks, LaunchConfig launch);

// A kernel that does nothing, launched plainly whatever the backend's
// CudaTuning::pdl (never as a programmatic dependent, and it never lets
// its own dependents launch early): whatever follows it on `stream` starts
// only once everything before it has finished and its writes are visible.
// Before the all-reduces of NCCL versions whose symmetric kernels start as
// programmatic dependents without waiting (TpWindowReduceNeedsFence).
cudaError_t LaunchStreamFence(cudaStream_t stream);

}  // namespace agentkv::backend::cuda::kernels
