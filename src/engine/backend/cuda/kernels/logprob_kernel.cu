// LaunchRowLogprobs (logprob_kernel.h): a row's log-sum-exp and top entries
// on the device, so that rows asking for logprobs need no copy of their
// logits to the host.
//
// Pass 1 reads the row once: each thread keeps the max and a sorted list of
// its `want` best (value, id) pairs (ids ascend within a thread, so a
// strict comparison keeps the lowest id on ties). Pass 2 sums exp(s * l -
// s * max) in double. The block then merges the threads' lists in `want`
// rounds: each round the best head by Better (value desc, id asc; NaN
// never enters) is written and its owner pops it.
#include <math_constants.h>

#include <climits>
#include <cstdint>

#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/logprob_kernel.h"
#include "engine/backend/cuda/kernels/pdl.cuh"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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

__device__ double BlockSum(double v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.dv[warp] = v;
  __syncthreads();
  v = lane < kWarps ? sh.dv[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The block's best (value, id) by Better; every thread gets it.
__device__ void BlockBest(float& bv, int& bi, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int i = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, v, i);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sh.fv[warp] = bv;
    sh.fi[warp] = bi;
  }
  __syncthreads();
  bv = lane < kWarps ? sh.fv[lane] : -CUDART_INF_F;
  bi = lane < kWarps ? sh.fi[lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int i = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, v, i);
  }
}

__global__ void __launch_bounds__(kThreads)
    RowLogprobsKernel(const float* logits, int vocab, const RowPick* picks, const int32_t* chosen,
                      RowLogprobs* out) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ Shared sh;
  const RowPick p = picks[blockIdx.x];
  if (p.mode == PickMode::kHost || p.logprobs < 0) return;
  const int want = min(min(static_cast<int>(p.logprobs), kMaxRowLogprobs), vocab);
  const double scale =
      p.mode == PickMode::kDevice ? 1.0 / static_cast<double>(p.sample.temperature) : 1.0;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;

  float tv[kMaxRowLogprobs];
  int ti[kMaxRowLogprobs];
  int tn = 0;
  float m = -CUDART_INF_F;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
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
  double lse = 0.0;
  if (m > -CUDART_INF_F) {
    const double ms = static_cast<double>(m) * scale;
    double s = 0.0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = row[i];
      if (!isnan(v)) s += exp(static_cast<double>(v) * scale - ms);
    }
    lse = ms + log(BlockSum(s, sh));
  }
  RowLogprobs& o = out[blockIdx.x];
  int head = 0;
  for (int k = 0; k < want; ++k) {
    float bv = head < tn ? tv[head] : -CUDART_INF_F;
    int bi = head < tn ? ti[head] : INT_MAX;
    BlockBest(bv, bi, sh);
    if (head < tn && ti[head] == bi) ++head;  // ids are unique: one owner
    if (threadIdx.x == 0) {
      o.ids[k] = bi;
      o.logprobs[k] = static_cast<float>(static_cast<double>(bv) * scale - lse);
    }
  }
  if (threadIdx.x == 0) {
    // Fewer non-NaN tokens than asked: only those (the reference's count).
    int count = 0;
    while (count < want && o.ids[count] != INT_MAX) ++count;
    o.count = count;
    o.lse = lse;
    const int c = chosen[blockIdx.x];
    // A NaN logit is no token (left out of lse): its logprob is -inf.
    o.chosen = c < 0 || c >= vocab ? 0.0f
               : isnan(row[c])     ? -INFINITY
                                   : static_cast<float>(static_cast<double>(row[c]) * scale - lse);
  }
}

}  // namespace

cudaError_t LaunchRowLogprobs(const float* logits, int rows, int vocab, const RowPick* picks,
                              const int32_t* chosen, RowLogprobs* out, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  return LaunchPdl(RowLogprobsKernel, dim3(rows), dim3(kThreads), 0, launch, logits, vocab, picks,
                   chosen, out);
}

}  // namespace agentkv::backend::cuda::kernels
