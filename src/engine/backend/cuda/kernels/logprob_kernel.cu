// LaunchRowLogprobs (logprob_kernel.h): a row's log-sum-exp and top entries
// on the device, so that rows asking for logprobs need no copy of their
// logits to the host.
//
// The row is cut into RowLogprobsSlices slices, one block each (the row's
// work spread over as many SMs). A slice block reads its slice twice: pass
// 1 finds the max and keeps, per thread, a sorted list of its `want` best
// (value, id) pairs (ids ascend within a thread, so a strict comparison
// keeps the lowest id on ties); pass 2 sums exp(s * l - s * max) in double.
// The block then merges its threads' lists in `want` rounds (each round the
// best head by Better, value desc and id asc, NaN never entering, is
// written and its owner pops it) into the slice's partial. A second kernel,
// one warp per row (a lane per slice), rescales the slices' sums to the
// row's max for the log-sum-exp and merges their lists the same way: the
// row's best `want` entries are among the slices' best `want`.
#include <math_constants.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/logprob_kernel.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSliceLogits = 4096;
constexpr int kMaxSlices = 32;  // one merge lane each

// One slice's result.
struct Part {
  double sum = 0.0;  // sum of exp(s * l - s * max) over its non-NaN logits
  float max = 0.0f;  // -inf: no non-NaN logit other than -inf
  int32_t count = 0;
  float v[kMaxRowLogprobs];
  int32_t id[kMaxRowLogprobs];
};

struct Shared {
  float fv[kWarps];
  int fi[kWarps];
  double dv[kWarps];
};

__device__ float BlockMax(float v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.fv[warp] = v;
  __syncthreads();
  v = lane < kWarps ? sh.fv[lane] : -CUDART_INF_F;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ double WarpSum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ double BlockSum(double v, Shared& sh) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.dv[warp] = v;
  __syncthreads();
  v = lane < kWarps ? sh.dv[lane] : 0.0;
  return WarpSum(v);
}

__device__ void WarpBest(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int i = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, v, i);
  }
}

// The block's best (value, id) by Better; every thread gets it.
__device__ void BlockBest(float& bv, int& bi, Shared& sh) {
  WarpBest(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sh.fv[warp] = bv;
    sh.fi[warp] = bi;
  }
  __syncthreads();
  bv = lane < kWarps ? sh.fv[lane] : -CUDART_INF_F;
  bi = lane < kWarps ? sh.fi[lane] : INT_MAX;
  WarpBest(bv, bi);
}

__device__ int Want(const RowPick& p, int vocab) {
  return min(min(static_cast<int>(p.logprobs), kMaxRowLogprobs), vocab);
}

__device__ double Scale(const RowPick& p) {
  return p.mode == PickMode::kDevice ? 1.0 / static_cast<double>(p.sample.temperature) : 1.0;
}

// Grid (slices, rows).
__global__ void __launch_bounds__(kThreads)
    SliceKernel(const float* logits, int vocab, int slices, const RowPick* picks, Part* parts) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ Shared sh;
  const int r = blockIdx.y;
  const RowPick p = picks[r];
  if (p.mode == PickMode::kHost || p.logprobs < 0) return;
  const int want = Want(p, vocab);
  const double scale = Scale(p);
  const int per = (vocab + slices - 1) / slices;
  const int lo = min(vocab, static_cast<int>(blockIdx.x) * per);
  const int hi = min(vocab, lo + per);
  const float* row = logits + static_cast<int64_t>(r) * vocab;

  float tv[kMaxRowLogprobs];
  int ti[kMaxRowLogprobs];
  int tn = 0;
  float m = -CUDART_INF_F;
  for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float v = row[i];
    if (isnan(v)) continue;
    m = fmaxf(m, v);
    if (want == 0 || (tn == want && !(v > tv[want - 1]))) continue;
    int pos = tn < want ? tn++ : want - 1;
    while (pos > 0 && v > tv[pos - 1]) {
      tv[pos] = tv[pos - 1];
      ti[pos] = ti[pos - 1];
      --pos;
    }
    tv[pos] = v;
    ti[pos] = i;
  }
  m = BlockMax(m, sh);
  double sum = 0.0;
  if (m > -CUDART_INF_F) {
    const double ms = static_cast<double>(m) * scale;
    double s = 0.0;
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
      const float v = row[i];
      if (!isnan(v)) s += exp(static_cast<double>(v) * scale - ms);
    }
    sum = BlockSum(s, sh);
  }
  Part& o = parts[static_cast<int64_t>(r) * slices + blockIdx.x];
  int head = 0, count = 0;
  for (int k = 0; k < want; ++k) {
    float bv = head < tn ? tv[head] : -CUDART_INF_F;
    int bi = head < tn ? ti[head] : INT_MAX;
    BlockBest(bv, bi, sh);
    if (head < tn && ti[head] == bi) ++head;  // ids are unique: one owner
    if (bi != INT_MAX) count = k + 1;
    if (threadIdx.x == 0) {
      o.v[k] = bv;
      o.id[k] = bi;
    }
  }
  if (threadIdx.x == 0) {
    o.count = count;
    o.max = m;
    o.sum = sum;
  }
}

// One warp per row; lane j merges slice j.
__global__ void __launch_bounds__(32)
    MergeKernel(const float* logits, int vocab, int slices, const RowPick* picks,
                const int32_t* chosen, const Part* parts, RowLogprobs* out) {
  PdlLaunchDependents();
  PdlWait();
  const int r = blockIdx.x;
  const RowPick p = picks[r];
  if (p.mode == PickMode::kHost || p.logprobs < 0) return;
  const int want = Want(p, vocab);
  const double scale = Scale(p);
  const int lane = threadIdx.x;
  const Part* mine = lane < slices ? &parts[static_cast<int64_t>(r) * slices + lane] : nullptr;
  const float pm = mine != nullptr ? mine->max : -CUDART_INF_F;
  float m = pm;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  double lse = 0.0;
  if (m > -CUDART_INF_F) {
    const double ms = static_cast<double>(m) * scale;
    const double t =
        pm > -CUDART_INF_F ? mine->sum * exp(static_cast<double>(pm) * scale - ms) : 0.0;
    lse = ms + log(WarpSum(t));
  }
  const int n = mine != nullptr ? mine->count : 0;
  RowLogprobs& o = out[r];
  int head = 0, count = 0;
  for (int k = 0; k < want; ++k) {
    float bv = head < n ? mine->v[head] : -CUDART_INF_F;
    int bi = head < n ? mine->id[head] : INT_MAX;
    WarpBest(bv, bi);
    if (head < n && mine->id[head] == bi) ++head;
    if (bi != INT_MAX) count = k + 1;
    if (lane == 0) {
      o.ids[k] = bi;
      o.logprobs[k] = static_cast<float>(static_cast<double>(bv) * scale - lse);
    }
  }
  if (lane == 0) {
    // Fewer non-NaN tokens than asked: only those (the reference's count).
    o.count = count;
    o.lse = lse;
    const int c = chosen[r];
    const float* row = logits + static_cast<int64_t>(r) * vocab;
    // A NaN logit is no token (left out of lse): its logprob is -inf.
    o.chosen = c < 0 || c >= vocab ? 0.0f
               : isnan(row[c])     ? -INFINITY
                                   : static_cast<float>(static_cast<double>(row[c]) * scale - lse);
  }
}

}  // namespace

int RowLogprobsSlices(int vocab) {
  return std::clamp((vocab + kSliceLogits - 1) / kSliceLogits, 1, kMaxSlices);
}

size_t RowLogprobsScratchBytes(int rows, int vocab) {
  return static_cast<size_t>(std::max(rows, 0)) * static_cast<size_t>(RowLogprobsSlices(vocab)) *
         sizeof(Part);
}

cudaError_t LaunchRowLogprobs(const float* logits, int rows, int vocab, const RowPick* picks,
                              const int32_t* chosen, RowLogprobs* out, void* scratch,
                              LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || scratch == nullptr) return cudaErrorInvalidValue;
  const int slices = RowLogprobsSlices(vocab);
  Part* parts = static_cast<Part*>(scratch);
  if (cudaError_t e = LaunchPdl(SliceKernel, dim3(slices, rows), dim3(kThreads), 0, launch, logits,
                                vocab, slices, picks, parts);
      e != cudaSuccess)
    return e;
  return LaunchPdl(MergeKernel, dim3(rows), dim3(32), 0, launch, logits, vocab, slices, picks,
                   chosen, static_cast<const Part*>(parts), out);
}

}  // namespace agentkv::backend::cuda::kernels
