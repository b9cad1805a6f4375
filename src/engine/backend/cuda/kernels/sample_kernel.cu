// LaunchSampleRows: SampleDraw (engine/backend/sample_draw.h) on the device, one
// block per row, without sorting the vocabulary.
//
// Weights are recomputed from the logits in every pass (w = expf((l - m) /
// T), as the CPU does) rather than stored: a row is read from L2 a few
// times, and nothing beyond the logits buffer is needed. The kept set is
// found by searching the weight's float bit pattern (non-negative floats
// order as their bits): for top_k the largest value v with count(w >= v) >=
// k, for top_p the largest v with sum(w >= v) >= target, each an 8-way
// search (seven thresholds tallied per pass, ten passes over [0, 1]). Ties
// at the boundary are taken in id order, as the CPU's (weight desc, id asc)
// order does, through a prefix count over contiguous per-thread chunks. The
// draw is a prefix sum (double) of the kept weights over those chunks: the
// thread whose chunk holds u * M rescans it in id order. A row with only
// temperature and min_p costs two passes; top_k and top_p add about twelve
// each.
#include <math_constants.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/sample_kernel.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// Thresholds tallied per search pass: kWays - 1, so each pass narrows the
// range to an eighth.
constexpr int kWays = 8;
constexpr uint32_t kOneBits = 0x3f800000u;  // 1.0f: the largest weight

struct Shared {
  double red[kWarps][2 * kWays];
  double res[2 * kWays];
  double incl[kThreads];
  float best_v[kWarps];
  int best_i[kWarps];
  int pick;
  int first;
};

__device__ __forceinline__ float Weight(float l, float m, float inv_t) {
  const float w = expf((l - m) * inv_t);
  return isnan(w) ? 0.f : w;
}

// Sums n (<= 2 * kWays) values over the block; every thread gets the sums.
__device__ void BlockSums(double* v, int n, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = 0; j < n; ++j) {
    double x = v[j];
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (lane == 0) sh.red[warp][j] = x;
  }
  __syncthreads();
  if (warp == 0) {
    for (int j = 0; j < n; ++j) {
      double x = lane < kWarps ? sh.red[lane][j] : 0.0;
      for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
      if (lane == 0) sh.res[j] = x;
    }
  }
  __syncthreads();
  for (int j = 0; j < n; ++j) v[j] = sh.res[j];
  __syncthreads();
}

// The best (value, index) of the block by Better (NaN never wins, lowest
// index on ties); every thread gets it.
__device__ void BlockBest(float& bv, int& bi, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, bv, o);
    const int i = __shfl_xor_sync(0xffffffffu, bi, o);
    Better(bv, bi, v, i);
  }
  if (lane == 0) {
    sh.best_v[warp] = bv;
    sh.best_i[warp] = bi;
  }
  __syncthreads();
  bv = sh.best_v[0];
  bi = sh.best_i[0];
  for (int w = 1; w < kWarps; ++w) Better(bv, bi, sh.best_v[w], sh.best_i[w]);
  __syncthreads();
}

// Inclusive prefix sum of one double per thread, in thread order; the
// block's total in `total`.
__device__ double BlockScan(double v, double& total, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) sh.red[warp][0] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < kWarps ? sh.red[lane][0] : 0.0;
    for (int o = 1; o < 32; o <<= 1) {
      const double n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < kWarps) sh.red[lane][1] = w;
  }
  __syncthreads();
  if (warp > 0) v += sh.red[warp - 1][1];
  total = sh.red[kWarps - 1][1];
  __syncthreads();
  return v;
}

// The boundary of the tokens kept so far: token i (weight bits b) is kept
// iff b > bits or (b == bits and i <= id); all are while !on.
struct Bound {
  bool on = false;
  uint32_t bits = 0;
  int id = 0;
  __device__ bool Keeps(uint32_t b, int i) const {
    return !on || b > bits || (b == bits && i <= id);
  }
};

struct Row {
  const float* x;
  int vocab;
  float m, inv_t;
  __device__ float W(int i) const { return Weight(x[i], m, inv_t); }
};

// For each of th[0..n): how many of the tokens `bound` keeps have weight
// bits >= th[j], and their weights' sum (cnt[j], sum[j]); every thread gets
// them.
__device__ void Tally(const Row& row, const Bound& bound, const uint32_t* th, int n, double* cnt,
                      double* sum, Shared& sh) {
  double v[2 * kWays];
  for (int j = 0; j < 2 * n; ++j) v[j] = 0.0;
  for (int i = threadIdx.x; i < row.vocab; i += kThreads) {
    const float w = row.W(i);
    const uint32_t b = __float_as_uint(w);
    if (!bound.Keeps(b, i)) continue;
    for (int j = 0; j < n; ++j) {
      if (b >= th[j]) {
        v[j] += 1.0;
        v[n + j] += w;
      }
    }
  }
  BlockSums(v, 2 * n, sh);
  for (int j = 0; j < n; ++j) {
    cnt[j] = v[j];
    sum[j] = v[n + j];
  }
}

// The largest weight bits b in [0, 1.0f] for which the tokens `bound` keeps
// with weight bits >= b number (by_count) or weigh at least `need`; 0 when
// none does (then not even b = 0 was checked).
__device__ uint32_t Search(const Row& row, const Bound& bound, bool by_count, double need,
                           Shared& sh) {
  uint32_t lo = 0, hi = kOneBits + 1;  // pred(lo) assumed, !pred(hi)
  while (hi - lo > 1) {
    uint32_t th[kWays - 1];
    for (int j = 0; j < kWays - 1; ++j)
      th[j] = lo + static_cast<uint32_t>(static_cast<uint64_t>(hi - lo) * (j + 1) / kWays);
    double cnt[kWays - 1], sum[kWays - 1];
    Tally(row, bound, th, kWays - 1, cnt, sum, sh);
    uint32_t nlo = lo, nhi = hi;
    for (int j = 0; j < kWays - 1; ++j) {
      const bool pred = (by_count ? cnt[j] : sum[j]) >= need;
      if (pred) {
        nlo = max(nlo, th[j]);
      } else {
        nhi = min(nhi, th[j]);
      }
    }
    lo = nlo;
    hi = nhi;
  }
  return lo;
}

// The token range of this thread in the id-ordered passes.
__device__ __forceinline__ void Chunk(int vocab, int& begin, int& end) {
  const int per = (vocab + kThreads - 1) / kThreads;
  begin = min(vocab, static_cast<int>(threadIdx.x) * per);
  end = min(vocab, begin + per);
}

// The id of the n-th (1-based) token with weight bits == bits, in id order;
// -1 if there are fewer.
__device__ int NthTie(const Row& row, uint32_t bits, int n, Shared& sh) {
  int begin, end;
  Chunk(row.vocab, begin, end);
  double own = 0.0;
  for (int i = begin; i < end; ++i) own += __float_as_uint(row.W(i)) == bits ? 1.0 : 0.0;
  if (threadIdx.x == 0) sh.pick = -1;
  double total;
  const double incl = BlockScan(own, total, sh);
  const double excl = incl - own;  // exact: counts are small integers
  if (own > 0.0 && excl < n && incl >= n) {
    int left = n - static_cast<int>(excl);
    for (int i = begin; i < end; ++i) {
      if (__float_as_uint(row.W(i)) == bits && --left == 0) {
        sh.pick = i;
        break;
      }
    }
  }
  __syncthreads();
  const int id = sh.pick;
  __syncthreads();
  return id;
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* logits, int vocab, const RowPick* picks, int32_t* out) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const RowPick p = picks[r];
  if (p.mode != PickMode::kDevice) return;
  Row row{logits + static_cast<int64_t>(r) * vocab, vocab, 0.f, 0.f};

  // 1. The argmax and largest logit; the argmax is the pick if that is not
  // finite, or if nothing is kept below.
  float m = -CUDART_INF_F;
  int best = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) Better(m, best, row.x[i], i);
  BlockBest(m, best, sh);
  if (!isfinite(m)) {
    if (threadIdx.x == 0) out[r] = best;
    return;
  }
  row.m = m;
  row.inv_t = 1.0f / p.sample.temperature;

  // 2. top_k, then top_p, as a boundary in (weight desc, id asc) order.
  Bound bound;
  double total = 0.0;
  const bool use_top_k = p.sample.top_k > 0 && p.sample.top_k < vocab;
  const bool use_top_p = p.sample.top_p < 1.0f;
  if (use_top_k) {
    const int k = p.sample.top_k;
    const uint32_t v = Search(row, bound, true, static_cast<double>(k), sh);
    const uint32_t th = v + 1;
    double gt_cnt, gt_sum;
    Tally(row, bound, &th, 1, &gt_cnt, &gt_sum, sh);
    const int ties = k - static_cast<int>(gt_cnt);  // >= 1: count(w >= v) >= k
    bound.on = true;
    bound.bits = v;
    bound.id = NthTie(row, v, ties, sh);
    total = gt_sum + static_cast<double>(ties) * __uint_as_float(v);
  }
  if (use_top_p) {
    if (!use_top_k) {
      const uint32_t th = 0;
      double all_cnt;
      Tally(row, bound, &th, 1, &all_cnt, &total, sh);
    }
    const double target = static_cast<double>(p.sample.top_p) * total;
    const uint32_t v = Search(row, bound, false, target, sh);
    // v == 0: rounding left the whole set short of the target; the CPU then
    // keeps the whole set too.
    if (v > 0) {
      const uint32_t th = v + 1;
      double gt_cnt, gt_sum;
      Tally(row, bound, &th, 1, &gt_cnt, &gt_sum, sh);
      const double w = __uint_as_float(v);
      // The fewest ties (in id order) that reach the target; sum(w > v) <
      // target, as the search found.
      const int ties = static_cast<int>(
          fmin(fmax(1.0, ceil((target - gt_sum) / w)), static_cast<double>(vocab)));
      int id = NthTie(row, v, ties, sh);
      // Rounding may ask for more ties than the set holds: then all of them
      // (the set's ties at v are a prefix in id order of all ties at v).
      const bool same = bound.on && bound.bits == v;
      if (id < 0) id = same ? bound.id : vocab;
      if (same) id = min(id, bound.id);
      bound.on = true;
      bound.bits = v;
      bound.id = id;
    }
  }

  // 3. min_p and the draw: the first kept id (id order) whose running sum
  // of weights exceeds u * M.
  const float cut = p.sample.min_p;
  auto kept = [&](int i, float& w) {
    w = row.W(i);
    return w > 0.f && w >= cut && bound.Keeps(__float_as_uint(w), i);
  };
  int begin, end;
  Chunk(vocab, begin, end);
  double own = 0.0;
  int last = -1;
  for (int i = begin; i < end; ++i) {
    float w;
    if (kept(i, w)) {
      own += w;
      last = i;
    }
  }
  if (threadIdx.x == 0) sh.first = kThreads;
  double mass;
  const double incl = BlockScan(own, mass, sh);
  sh.incl[threadIdx.x] = incl;
  // The last kept id of the row (Better on -id picks the largest id).
  float lv = last >= 0 ? 0.f : -CUDART_INF_F;
  int li = last >= 0 ? -last : 0;
  BlockBest(lv, li, sh);
  const int last_kept = lv == 0.f ? -li : -1;
  if (last_kept < 0) {  // nothing kept (1 / T overflowed): the argmax
    if (threadIdx.x == 0) out[r] = best;
    return;
  }
  const double target = p.sample.u * mass;
  // The first thread with kept tokens whose inclusive sum exceeds the
  // target (if rounding put the crossing's own sum at the target, the next
  // such thread, whose first kept token is then the pick).
  if (own > 0.0 && incl > target) atomicMin(&sh.first, static_cast<int>(threadIdx.x));
  __syncthreads();
  const int first = sh.first;
  if (first == kThreads) {  // rounding: u * M reached the total
    if (threadIdx.x == 0) out[r] = last_kept;
    return;
  }
  if (static_cast<int>(threadIdx.x) == first) {
    double run = threadIdx.x > 0 ? sh.incl[threadIdx.x - 1] : 0.0;
    int pick = last;  // rounding: the crossing is past this chunk's last kept token
    for (int i = begin; i < end; ++i) {
      float w;
      if (!kept(i, w)) continue;
      run += w;
      if (run > target) {
        pick = i;
        break;
      }
    }
    out[r] = pick;
  }
}

}  // namespace

cudaError_t LaunchSampleRows(const float* logits, int rows, int vocab, const RowPick* picks,
                             int32_t* out, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  SampleRowsKernel<<<rows, kThreads, 0, launch.stream>>>(logits, vocab, picks, out);
  return cudaGetLastError();
}

}  // namespace agentkv::backend::cuda::kernels
