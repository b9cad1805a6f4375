// LaunchSampleRows: SampleDraw (engine/backend/sample_draw.h) on the device, a
// cluster of C blocks per row (C from 1 to 8, so that the rows of a step
// cover the SMs; each block owns a contiguous 1/C of the ids and the
// blocks combine their partial results through distributed shared memory),
// without sorting the vocabulary.
//
// Weights are recomputed from the logits in every pass (w = expf((l - m) /
// T), as the CPU does) rather than stored: a row is read from L2 a few
// times, and nothing beyond the logits buffer is needed. The kept set is
// found by a radix search on the weight's float bit pattern (non-negative
// floats order as their bits, and [0, 1.0f] fits in 30): for top_k the
// largest value v with count(w >= v) >= k, for top_p the largest v with
// sum(w >= v) >= top_p * total. Each of three passes builds a 1,024-bin
// histogram in shared memory of the next 10 bits (count, and mass as an
// exact fixed-point sum in units of 2^-42, so that every thread, every
// block of the cluster and every launch sees the same sums whatever the
// order of the atomics), and a scan of it picks the bin holding the
// boundary, which the next pass splits. The scans also give the count and
// mass above the boundary, and top_p's total is the first histogram's sum.
// Ties at the boundary are taken in id order, as the CPU's (weight desc,
// id asc) order does, through a prefix count over contiguous per-thread
// chunks (a pass only when the boundary value holds more tokens than the
// set keeps). The draw is a prefix sum (double) of the kept weights over
// those chunks: the thread whose chunk holds u * M rescans it in id order.
// Passes over the row: temperature and min_p alone 2 (max, draw); top_k or
// top_p 5; both 8 (plus a tie pass where the boundary value is tied). A
// drafted row (RowPick::draft) is VerifyDraftRow: the same kept set, its
// draft token's share of the mass tested against u_accept (every block of
// the cluster weighs the draft token itself, so all decide alike), and on
// rejection the same draw with the draft token left out.
//
// The blocks of a cluster exchange partial results (a block's best, its
// histogram, its tie count and kept mass) through slots in their shared
// memory: each block writes its own, one cluster barrier, each reads all C
// in rank order and combines them the same way, so every block takes the
// same decisions. The slots alternate between two copies from one exchange
// to the next, so one barrier per exchange suffices (a copy is rewritten
// only after the next exchange's barrier, which every block reaches after
// reading it); a last barrier keeps each block's shared memory alive until
// the others are done reading it.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/argmax.cuh"
#include "engine/backend/cuda/kernels/sample_kernel.h"
#include "engine/backend/cuda/kernels/sample_search.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
// The radix search (sample_search.h): each thread scans two bins.
constexpr int kBinBits = kSampleBinBits;
constexpr int kBins = kSampleBins;
static_assert(kBins == 2 * kThreads, "a thread scans two bins");
constexpr int kTopShift = kSampleTopShift;
constexpr int kMaxCluster = kSampleMaxCluster;

using u64 = unsigned long long;

// What a block shows the other blocks of its cluster in one exchange.
struct Slot {
  float f;
  int i;
  double d;
};

struct Shared {
  double red[kWarps][2];
  u64 ured[kWarps][4];
  double incl[kThreads];
  // [exchange parity]: read by the other blocks of the cluster.
  unsigned int hist_cnt[2][kBins];
  u64 hist_mass[2][kBins];
  Slot slot[2];
  // The bin a histogram scan picked, and the count and mass of what lies
  // above it.
  int bin;
  u64 above_cnt, above_mass, bin_cnt;
  float best_v[kWarps];
  int best_i[kWarps];
  int pick;
  int first;
};

__device__ __forceinline__ float Weight(float l, float m, float inv_t) {
  const float w = expf((l - m) * inv_t);
  return isnan(w) ? 0.f : w;
}

// The block's place in its row's cluster, and the parity of the next
// exchange (the same sequence of exchanges runs in every block).
struct Cluster {
  int rank = 0, size = 1;
  int phase = 0;
};

// A barrier over the cluster's blocks (all threads of each); a block
// barrier where clusters do not exist (then the launcher makes C = 1).
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __syncthreads();
#endif
}

// p, a variable of this block's shared memory, in block `rank` of the
// cluster (p itself in a cluster of one).
template <class T>
__device__ __forceinline__ const T* InRank(const T* p, int rank, const Cluster& c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (c.size > 1)
    return cooperative_groups::this_cluster().map_shared_rank(const_cast<T*>(p), rank);
#endif
  (void)rank;
  (void)c;
  return p;
}

// One exchange: thread 0 has put the block's part in the returned slot
// (the caller writes it, then calls Publish); after Publish every block's
// slot of this parity can be read with InRank.
__device__ __forceinline__ Slot& MySlot(Shared& sh, const Cluster& c) { return sh.slot[c.phase]; }
__device__ __forceinline__ void Publish(Cluster& c) {
  if (c.size > 1) {
    ClusterSync();
  } else {
    __syncthreads();
  }
  c.phase ^= 1;
}
// The slot of rank q in the exchange just published.
__device__ __forceinline__ const Slot& SlotOf(const Shared& sh, const Cluster& c, int q) {
  return *InRank(&sh.slot[c.phase ^ 1], q, c);
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

// Inclusive prefix sums, in thread order, of two integers per thread; the
// block's totals in ta and tb.
__device__ void BlockScan2(u64& a, u64& b, u64& ta, u64& tb, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 na = __shfl_up_sync(0xffffffffu, a, o);
    const u64 nb = __shfl_up_sync(0xffffffffu, b, o);
    if (lane >= o) {
      a += na;
      b += nb;
    }
  }
  if (lane == 31) {
    sh.ured[warp][0] = a;
    sh.ured[warp][1] = b;
  }
  __syncthreads();
  if (warp == 0) {
    u64 wa = lane < kWarps ? sh.ured[lane][0] : 0, wb = lane < kWarps ? sh.ured[lane][1] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const u64 na = __shfl_up_sync(0xffffffffu, wa, o);
      const u64 nb = __shfl_up_sync(0xffffffffu, wb, o);
      if (lane >= o) {
        wa += na;
        wb += nb;
      }
    }
    if (lane < kWarps) {
      sh.ured[lane][2] = wa;
      sh.ured[lane][3] = wb;
    }
  }
  __syncthreads();
  if (warp > 0) {
    a += sh.ured[warp - 1][2];
    b += sh.ured[warp - 1][3];
  }
  ta = sh.ured[kWarps - 1][2];
  tb = sh.ured[kWarps - 1][3];
  __syncthreads();
}

__device__ __forceinline__ u64 Fixed(float w) { return SampleFixed(w); }

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

// A row, and the ids [begin, end) this block owns.
struct Row {
  const float* __restrict__ x;
  int vocab;
  int begin, end;
  float m, inv_t;
  __device__ float W(int i) const { return Weight(x[i], m, inv_t); }
};

// f(i, x[i]) for every token, in a coalesced stride; four loads per thread
// are issued before any is used (one at a time, a pass is a chain of L2
// round trips).
template <class F>
__device__ __forceinline__ void ForEach(const Row& row, F&& f) {
  int i = row.begin + static_cast<int>(threadIdx.x);
  for (; i + 3 * kThreads < row.end; i += 4 * kThreads) {
    float x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = row.x[i + j * kThreads];
#pragma unroll
    for (int j = 0; j < 4; ++j) f(i + j * kThreads, x[j]);
  }
  for (; i < row.end; i += kThreads) f(i, row.x[i]);
}

// What Search found: the largest weight bits v for which the tokens the
// bound keeps with bits >= v number at least k (by count) or weigh at
// least `need` (by mass), with the count and mass of those kept above v
// and the count at v. found is false only when no v qualifies (by mass,
// with a zero total).
struct Found {
  bool found = false;
  uint32_t v = 0;
  u64 gt_cnt = 0, gt_mass = 0, eq_cnt = 0;
  u64 need = 0;  // by mass: ceil(top_p * total), in fixed point
};

// The radix search over the tokens `bound` keeps: by count with need k, or
// by mass with need top_p times their total mass. Every thread of every
// block of the cluster gets the same result.
__device__ Found Search(const Row& row, const Bound& bound, bool by_count, int k, float top_p,
                        Cluster& c, Shared& sh) {
  Found res;
  u64 need = by_count ? static_cast<u64>(k) : 0;
  uint32_t lo = 0;
  u64 above_cnt = 0, above_mass = 0;
  for (int shift = kTopShift; shift >= 0; shift -= kBinBits) {
    const uint32_t span = static_cast<uint32_t>(kBins) << shift;
    unsigned int* hist_cnt = sh.hist_cnt[c.phase];
    u64* hist_mass = sh.hist_mass[c.phase];
    for (int j = threadIdx.x; j < kBins; j += kThreads) {
      hist_cnt[j] = 0u;
      hist_mass[j] = 0ull;
    }
    if (threadIdx.x == 0) sh.bin = -1;
    __syncthreads();
    // Zero weights (masked, underflowed, NaN) are common and all land in
    // bin 0: counted in a register, not by contended atomics.
    unsigned int zeros = 0;
    ForEach(row, [&](int i, float l) {
      const float w = Weight(l, row.m, row.inv_t);
      const uint32_t b = __float_as_uint(w);
      if (b - lo >= span || !bound.Keeps(b, i)) return;  // (b < lo wraps)
      if (b == 0u) {
        ++zeros;
        return;
      }
      const uint32_t bin = (b - lo) >> shift;
      atomicAdd(&hist_cnt[bin], 1u);
      if (by_count) return;  // (top_k needs no mass)
      const u64 q = Fixed(w);
      if (q != 0ull) atomicAdd(&hist_mass[bin], q);
    });
    if (zeros != 0u) atomicAdd(&hist_cnt[0], zeros);
    Publish(c);  // (also the block barrier after the atomics)
    // The cluster's histogram at this thread's two bins: the blocks' sums.
    const int b1 = 2 * static_cast<int>(threadIdx.x) + 1, b0 = b1 - 1;
    u64 c0 = 0, c1 = 0, q0 = 0, q1 = 0;
    for (int q = 0; q < c.size; ++q) {
      const unsigned int* hc = InRank(hist_cnt, q, c);
      const u64* hm = InRank(hist_mass, q, c);
      c0 += hc[b0];
      c1 += hc[b1];
      q0 += hm[b0];
      q1 += hm[b1];
    }
    u64 ca = c0 + c1, qa = q0 + q1, tc, tq;
    BlockScan2(ca, qa, tc, tq, sh);
    if (shift == kTopShift && !by_count) {
      // The first histogram holds every kept token: their total.
      need = SampleTopPNeed(top_p, tq);
    }
    // Count and mass of the kept tokens above this thread's two bins.
    const u64 sc = above_cnt + (tc - ca), sq = above_mass + (tq - qa);
    SampleBinPick pick;
    if (SamplePickBin(b0, c0, c1, q0, q1, sc, sq, need, by_count, &pick)) {
      sh.bin = pick.bin;
      sh.above_cnt = pick.above_cnt;
      sh.above_mass = pick.above_mass;
      sh.bin_cnt = pick.bin_cnt;
    }
    __syncthreads();
    const int bin = sh.bin;
    above_cnt = sh.above_cnt;
    above_mass = sh.above_mass;
    const u64 bin_cnt = sh.bin_cnt;
    __syncthreads();
    if (bin < 0) return res;  // no bin reaches the need (only at the top level)
    lo += static_cast<uint32_t>(bin) << shift;
    if (shift == 0) {
      res.found = true;
      res.v = lo;
      res.gt_cnt = above_cnt;
      res.gt_mass = above_mass;
      res.eq_cnt = bin_cnt;
    }
  }
  res.need = need;
  return res;
}

// The token range of this thread in the id-ordered passes: a contiguous
// share of the block's.
__device__ __forceinline__ void Chunk(const Row& row, int& begin, int& end) {
  const int per = (row.end - row.begin + kThreads - 1) / kThreads;
  begin = min(row.end, row.begin + static_cast<int>(threadIdx.x) * per);
  end = min(row.end, begin + per);
}

// The id of the n-th (1-based) token with weight bits == bits, in id order;
// -1 if there are fewer. The same in every block of the cluster.
__device__ int NthTie(const Row& row, uint32_t bits, int n, Cluster& c, Shared& sh) {
  int begin, end;
  Chunk(row, begin, end);
  double own = 0.0;
  for (int i = begin; i < end; ++i) own += __float_as_uint(row.W(i)) == bits ? 1.0 : 0.0;
  double total;
  const double incl = BlockScan(own, total, sh);
  // The ties of the blocks before this one (counts: exact in double).
  if (threadIdx.x == 0) MySlot(sh, c).d = total;
  Publish(c);
  double before = 0.0;
  for (int q = 0; q < c.rank; ++q) before += SlotOf(sh, c, q).d;
  if (threadIdx.x == 0) sh.pick = -1;
  __syncthreads();
  const double excl = before + incl - own;
  if (own > 0.0 && excl < n && before + incl >= n) {
    int left = n - static_cast<int>(excl);
    for (int i = begin; i < end; ++i) {
      if (__float_as_uint(row.W(i)) == bits && --left == 0) {
        sh.pick = i;
        break;
      }
    }
  }
  __syncthreads();
  // At most one block found it.
  if (threadIdx.x == 0) MySlot(sh, c).i = sh.pick;
  Publish(c);
  int id = -1;
  for (int q = 0; q < c.size; ++q) id = max(id, SlotOf(sh, c, q).i);
  return id;
}

// Row r's pick, by the block of rank c.rank of the row's cluster; returns
// at points every block of the cluster reaches together.
__device__ void SampleRow(const float* logits, int vocab, const RowPick& p, int r, Cluster& c,
                          int32_t* out, Shared& sh) {
  const int per = (vocab + c.size - 1) / c.size;
  const int begin = min(vocab, c.rank * per);
  Row row{
      logits + static_cast<int64_t>(r) * vocab, vocab, begin, min(vocab, begin + per), 0.f, 0.f};

  // 1. The argmax and largest logit; the argmax is the pick if that is not
  // finite, or if nothing is kept below.
  float m = -CUDART_INF_F;
  int best = 0;
  ForEach(row, [&](int i, float l) { Better(m, best, l, i); });
  BlockBest(m, best, sh);
  if (threadIdx.x == 0) {
    MySlot(sh, c).f = m;
    MySlot(sh, c).i = best;
  }
  Publish(c);
  for (int q = 0; q < c.size; ++q) Better(m, best, SlotOf(sh, c, q).f, SlotOf(sh, c, q).i);
  if (!isfinite(m)) {
    if (c.rank == 0 && threadIdx.x == 0) out[r] = best;
    return;
  }
  row.m = m;
  row.inv_t = 1.0f / p.sample.temperature;

  // 2. top_k, then top_p, as a boundary in (weight desc, id asc) order.
  Bound bound;
  const bool use_top_k = p.sample.top_k > 0 && p.sample.top_k < vocab;
  const bool use_top_p = p.sample.top_p < 1.0f;
  if (use_top_k) {
    const int k = p.sample.top_k;
    // Always found: the whole row counts vocab > k tokens.
    const Found f = Search(row, bound, true, k, 1.0f, c, sh);
    const u64 ties = static_cast<u64>(k) - f.gt_cnt;  // in [1, eq_cnt]
    bound.on = true;
    bound.bits = f.v;
    bound.id = ties >= f.eq_cnt ? vocab : NthTie(row, f.v, static_cast<int>(ties), c, sh);
  }
  if (use_top_p) {
    // Not found: the kept weights sum to zero (1 / T overflowed); nothing
    // is kept below and the argmax is the pick, as on the CPU.
    const Found f = Search(row, bound, false, 0, p.sample.top_p, c, sh);
    if (f.found) {
      const uint32_t v = f.v;
      // The fewest ties (in id order) that reach the need: the mass above
      // v falls short of it (need > gt_mass), and every tie weighs qv.
      const u64 ties = SampleTopPTies(f.need, f.gt_mass, Fixed(__uint_as_float(v)), f.eq_cnt);
      // The set's ties at v are a prefix in id order of all ties at v.
      const bool same = bound.on && bound.bits == v;
      int id = same ? bound.id : vocab;
      if (ties < f.eq_cnt) {
        const int nth = NthTie(row, v, static_cast<int>(ties), c, sh);
        if (nth >= 0) id = min(id, nth);
      }
      bound.on = true;
      bound.bits = v;
      bound.id = id;
    }
  }

  // 3. min_p and the draw: the first kept id (id order) whose running sum
  // of weights exceeds u * M. A drafted row (p.draft >= 0) first tests its
  // draft token d: accepted when u_accept < w(d) / M; otherwise the draw
  // runs over the kept tokens without d (the residual), so every sum below
  // leaves d out and M is the residual's mass.
  const float cut = p.sample.min_p;
  auto kept = [&](int i, float& w) {
    w = row.W(i);
    return w > 0.f && w >= cut && bound.Keeps(__float_as_uint(w), i);
  };
  const int d = p.draft;
  float wd = 0.f;
  const bool d_kept = d >= 0 && d < vocab && kept(d, wd);
  if (!d_kept) wd = 0.f;
  int begin_i, end_i;
  Chunk(row, begin_i, end_i);
  double own = 0.0;
  int last = -1;
  for (int i = begin_i; i < end_i; ++i) {
    float w;
    if (kept(i, w) && i != d) {
      own += w;
      last = i;
    }
  }
  if (threadIdx.x == 0) sh.first = kThreads;
  double mass;
  const double incl = BlockScan(own, mass, sh);
  sh.incl[threadIdx.x] = incl;
  // The block's last kept id (Better on -id picks the largest id).
  float lv = last >= 0 ? 0.f : -CUDART_INF_F;
  int li = last >= 0 ? -last : 0;
  BlockBest(lv, li, sh);
  if (threadIdx.x == 0) {
    MySlot(sh, c).d = mass;
    MySlot(sh, c).i = lv == 0.f ? -li : -1;
  }
  Publish(c);
  // The cluster's mass and last kept id, and the mass before each block,
  // summed in rank order by every block alike; the crossing block: the
  // first whose running sum exceeds u * M.
  double total = 0.0, before = 0.0;
  int last_kept = -1;
  for (int q = 0; q < c.size; ++q) {
    const Slot& s = SlotOf(sh, c, q);
    total += s.d;
    last_kept = max(last_kept, s.i);
  }
  if (last_kept < 0 && !d_kept) {  // nothing kept (1 / T overflowed): the argmax
    if (c.rank == 0 && threadIdx.x == 0) out[r] = best;
    return;
  }
  if (d >= 0) {
    // Accepted, or nothing but d kept (then p(d) = 1: accepted whatever
    // rounding says, as the CPU's empty residual gives d).
    const double pd = d_kept ? static_cast<double>(wd) / (total + static_cast<double>(wd)) : 0.0;
    if (p.u_accept < pd || last_kept < 0) {
      if (c.rank == 0 && threadIdx.x == 0) out[r] = d;
      return;
    }
  }
  const double target = p.sample.u * total;
  int crossing = -1;
  for (int q = 0; q < c.size && crossing < 0; ++q) {
    const Slot& s = SlotOf(sh, c, q);
    if (s.d > 0.0 && before + s.d > target) {
      crossing = q;
    } else {
      before += s.d;
    }
  }
  if (crossing < 0) {  // rounding: u * M reached the total
    if (c.rank == 0 && threadIdx.x == 0) out[r] = last_kept;
    return;
  }
  if (crossing != c.rank) return;
  // The first thread with kept tokens whose inclusive sum exceeds the
  // target (if rounding put the crossing's own sum at the target, the next
  // such thread, whose first kept token is then the pick; if rounding
  // leaves none, the block's last kept token).
  if (own > 0.0 && before + incl > target) atomicMin(&sh.first, static_cast<int>(threadIdx.x));
  __syncthreads();
  const int first = sh.first;
  if (first == kThreads) {  // not reached: the block's total decided
    if (threadIdx.x == 0) out[r] = -li;
    return;
  }
  if (static_cast<int>(threadIdx.x) == first) {
    double run = before + (threadIdx.x > 0 ? sh.incl[threadIdx.x - 1] : 0.0);
    int pick = last;  // rounding: the crossing is past this chunk's last kept token
    for (int i = begin_i; i < end_i; ++i) {
      float w;
      if (!kept(i, w) || i == d) continue;
      run += w;
      if (run > target) {
        pick = i;
        break;
      }
    }
    out[r] = pick;
  }
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* logits, int vocab, const RowPick* picks, int32_t* out,
                     int cluster) {
  __shared__ Shared sh;
  Cluster c;
  c.size = cluster;
  c.rank = static_cast<int>(blockIdx.x) % cluster;
  const int r = static_cast<int>(blockIdx.x) / cluster;
  const RowPick p = picks[r];
  if (p.mode != PickMode::kDevice) return;  // (the whole cluster)
  SampleRow(logits, vocab, p, r, c, out, sh);
  // The other blocks may still read this one's shared memory.
  if (cluster > 1) ClusterSync();
}

}  // namespace

cudaError_t LaunchSampleRows(const float* logits, int rows, int vocab, const RowPick* picks,
                             int32_t* out, LaunchConfig launch, int cluster) {
  if (rows <= 0) return cudaSuccess;
  // Whether this binary's kernel has clusters (built from PTX for sm_90 or
  // later; an sm_80 build JIT-compiled on a Hopper has not): a fact of the
  // binary, asked once.
  static const bool has_clusters = [] {
    cudaFuncAttributes a{};
    return cudaFuncGetAttributes(&a, SampleRowsKernel) == cudaSuccess && a.ptxVersion >= 90;
  }();
  if (cluster > 1 && !has_clusters) return cudaErrorNotSupported;
  if (cluster <= 0 && !has_clusters) cluster = 1;
  if (cluster <= 0) {
    int device = 0, sms = 0, major = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (e != cudaSuccess) return e;
    cluster = SampleClusterSize(rows, sms, major);
  }
  if (cluster > kMaxCluster) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows * cluster));
  config.blockDim = dim3(kThreads);
  config.stream = launch.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&config, SampleRowsKernel, logits, vocab, picks, out, cluster);
}

}  // namespace agentkv::backend::cuda::kernels
