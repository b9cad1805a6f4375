// Where a tensor-parallel rank's all-reduced buffers live and what their
// all-reduces need (docs/tensor-parallel.md, "All-reduce buffers"), decided
// from sizes and versions alone so that the CPU tests check it
// (tests/engine/backend/tp_reduce_plan_test.cc); cuda::CudaBackend and
// cuda::TpBackend act on it.
//
// - TpReduceArenaFor: the layout of a rank's NCCL symmetric window.
// - PlaceTpReduce: for a token capacity and the window a rank was given,
//   which buffers are views of the window and at which offsets.
// - TpWindowReduceNeedsFence: whether an all-reduce from the window must be
//   preceded by a kernel launched without programmatic dependent launch.
//
// Pure functions; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/model/model_config.h"

namespace agentkv::backend {

// A rank's all-reduced buffers in one symmetric NCCL window (NcclWindows):
// the residual stream (tokens x hidden fp32) at offset 0 and, for
// sandwich-norm models (whose o projection's output is summed before its
// norm), that output at `attn_out`, each on a kTpWindowAlign boundary
// (NCCL's window alignment: the offsets are the same on every rank).
// `bytes`: the window's size for steps of up to `tokens` tokens (at least
// one token's).
inline constexpr size_t kTpWindowAlign = 4096;
struct TpReduceArena {
  size_t residual_bytes = 0;
  size_t attn_out = 0;  // offset; 0 when the model sums no o output apart
  size_t bytes = 0;
};
TpReduceArena TpReduceArenaFor(const model::ModelConfig& config, int64_t tokens);

// Where the residual stream x and the o output live for a capacity of
// `tokens` tokens (at least one) given a window of `window_bytes` (0: no
// window): in the window at TpReduceArenaFor's offsets when its layout
// fits, x always and o only for sandwich-norm models (the others never sum
// o: it stays an allocation of its own); otherwise both are allocations of
// their own. Every rank gets a window of the same size and the same
// capacity, so the placement (and NCCL's choice of kernel) is the same on
// every rank.
struct TpReducePlacement {
  size_t buffer_bytes = 0;  // each buffer's size: tokens x hidden x 4
  bool x_in_window = false;
  size_t x_offset = 0;
  bool o_in_window = false;
  size_t o_offset = 0;
};
TpReducePlacement PlaceTpReduce(const model::ModelConfig& config, int64_t tokens,
                                size_t window_bytes);

// NCCL's version code for major.minor.patch (as ncclGetVersion reports it
// and NCCL_VERSION makes it from 2.9 on).
constexpr int NcclVersionCode(int major, int minor, int patch) {
  return major * 10000 + minor * 100 + patch;
}
// The NCCL versions whose symmetric kernels read their buffers without
// waiting for the kernel before them (see below): from 2.28.0 (the move of
// the symmetric kernels to NCCL's device API dropped their
// cudaGridDependencySynchronize) until 2.30.7, which put it back.
inline constexpr int kNcclSymmetricWaitDropped = NcclVersionCode(2, 28, 0);
inline constexpr int kNcclSymmetricWaitRestored = NcclVersionCode(2, 30, 7);

// Whether an all-reduce from a symmetric window needs a fence before it on
// the stream, for the NCCL library loaded (`nccl_version`, ncclGetVersion)
// on a device of compute capability `compute_major`.x. From compute
// capability 9.0 NCCL launches its symmetric kernels as programmatic
// dependents of the kernel before them on the stream (they may start once
// that kernel lets its dependents launch, and must wait for it before
// reading). Every kernel of the CUDA backend lets its dependents launch at
// its start (kernels/pdl.cuh, counting on each dependent's wait), so with
// an NCCL whose symmetric kernels do not wait, the all-reduce reads (and
// sends its peers) the buffer before the kernel that writes it has run:
// garbage sums, different from run to run. The fence is a kernel launched
// without programmatic dependent launch (kernels::LaunchStreamFence): it
// starts only once everything before it has finished and its writes are
// visible, and writes nothing for the all-reduce to race with.
bool TpWindowReduceNeedsFence(int nccl_version, int compute_major);

}  // namespace agentkv::backend
