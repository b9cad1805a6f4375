// Where a tensor-parallel rank's all-reduced buffers live and what their
// all-reduces need (docs/tensor-parallel.md, "All-reduce buffers"), decided
// from sizes and versions alone so that the CPU tests check it
// (tests/engine/backend/tp_reduce_plan_test.cc); cuda::CudaBackend and
// cuda::TpBackend act on it.
//
// - TpReduceFromWindow: whether an all-reduce of a given size runs from the
//   window or from a plain buffer (TpWindowTokens: the most tokens a step
//   may have for its all-reduces to run from the window; TpStepFromWindow:
//   a step's choice).
// - TpReduceArenaFor: the layout of a rank's NCCL symmetric window.
// - PlaceTpReduce: for the rows a window is to hold and the window a rank
//   was given, which buffers have views in the window and at which offsets.
// - TpWindowReduceNeedsFence: whether an all-reduce from the window must be
//   preceded by a kernel launched without programmatic dependent launch.
//
// Pure functions; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/model/model_config.h"

namespace agentkv::backend {

// The largest all-reduce, in bytes, that runs from the symmetric window;
// larger ones run from plain buffers. Measured on 2 x H100 80GB HBM3,
// NCCL 2.28.9 (cuda_allreduce_bench, graph-replayed fp32 sums;
// bench/RESULTS.md, "Tensor parallelism: windows chosen by size"), µs per
// all-reduce, plain / window behind the fence:
//   8 KiB 6.43 / 4.96, 16 KiB 6.64 / 5.24, 24 KiB 6.67 / 6.70,
//   32 KiB 6.80 / 6.94, 64 KiB 6.87 / 8.68, 1 MiB 12.6 / 15.7.
// (2 x H200 earlier: 8 KiB 6.34 / 4.63, 64 KiB 6.82 / 8.17.) The window
// (NCCL's symmetric kernels) leads by 1.4-1.5 µs up to 16 KiB, ties at
// 24 KiB and trails from 32 KiB on, so it is chosen up to 16 KiB. An NCCL
// whose symmetric kernels need no fence (TpWindowReduceNeedsFence false)
// saves the window its ~0.7 µs and would move the crossover up; that is
// unmeasured, so the same bound holds there.
// A residual row is hidden x 4 bytes (fp32): 16 KiB at hidden 4,096, so a
// decode step of one sequence of an 8B model sums from the window; at
// hidden 8,192 (70B) no step does.
inline constexpr size_t kTpWindowReduceMaxBytes = size_t{16} << 10;

// Whether an all-reduce of `bytes` runs from the rank's symmetric window
// (where the rank has one) rather than from a plain buffer: from 1 byte up
// to kTpWindowReduceMaxBytes.
bool TpReduceFromWindow(size_t bytes);

// The most tokens a step may have and still all-reduce from the window
// (its buffers are tokens x hidden x 4 bytes; TpReduceFromWindow); 0 where
// one token's row is already larger.
int64_t TpWindowTokens(const model::ModelConfig& config);

// Whether a step of `tokens` tokens sums from views of `window_rows` rows
// in the window (0: none): TpReduceFromWindow for its all-reduces (tokens x
// hidden x 4 bytes each) and room for its rows. Every rank asks with the
// same step and the same views, so all sum from a window or none.
bool TpStepFromWindow(const model::ModelConfig& config, int64_t tokens, int64_t window_rows);

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

// Where views of the residual stream x and the o output of `tokens` rows
// (at least one) lie in a window of `window_bytes` (0: no window): at
// TpReduceArenaFor's offsets when its layout fits, x always and o only for
// sandwich-norm models (the others never sum o); otherwise no view at all.
// A rank keeps allocations of its own for whole steps beside them and runs
// a step from the views when TpReduceFromWindow says so for the step's
// size (CudaBackend). Every rank gets a window of the same size and the
// same rows, so the placement (and NCCL's choice of kernel) is the same on
// every rank.
struct TpReducePlacement {
  size_t buffer_bytes = 0;  // each view's size: tokens x hidden x 4
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
