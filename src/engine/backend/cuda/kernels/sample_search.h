// The decisions of the sampling kernel (sample_kernel.cu) as pure functions
// of host and device (compiled by nvcc for the kernel, by the host compiler
// for tests that need no GPU and no CUDA toolkit):
// - how many blocks (a cluster) share a row (SampleClusterSize);
// - the radix search for a top_k / top_p boundary on a weight's float bits
//   (weights are in [0, 1.0f], whose bits fit in 30, and non-negative
//   floats order as their bits): three levels of kSampleBins bins, 10 bits
//   each; at each level the bin holding the boundary (SamplePickBin) given
//   each bin's count and mass and what lies above the bins;
// - masses in fixed point (SampleFixed: units of 2^-42, summed exactly in
//   64 bits, so every thread, block and launch gets the same sums);
// - top_p's need (SampleTopPNeed) and the ties it takes at the boundary
//   (SampleTopPTies).
// The kernel runs exactly these functions, so the host tests pin the
// arithmetic the device does.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define AGENTKV_SAMPLE_HD __host__ __device__
#else
#define AGENTKV_SAMPLE_HD
#endif

namespace agentkv::backend::cuda::kernels {

// The portable cluster size: the most blocks that share a row.
inline constexpr int kSampleMaxCluster = 8;
// The radix search: levels of kSampleBinBits bits, the first at
// kSampleTopShift (1.0f's bits >> 20 < kSampleBins), then 10, then 0.
inline constexpr int kSampleBinBits = 10;
inline constexpr int kSampleBins = 1 << kSampleBinBits;
inline constexpr int kSampleTopShift = 20;

// Blocks per row for `rows` rows on a device of `sms` SMs and compute
// capability major `cc_major`: the largest power of two up to 8 with rows *
// blocks <= sms, so that a step's rows spread over the SMs (at least 1;
// always 1 before Hopper, which has no clusters).
inline int SampleClusterSize(int rows, int sms, int cc_major) {
  if (rows <= 0 || cc_major < 9) return 1;
  int c = 1;
  while (c < kSampleMaxCluster && rows * c * 2 <= sms) c *= 2;
  return c;
}

// A weight's mass in fixed point: round(w * 2^42) (exact scaling; the sum
// of up to 2^21 weights <= 1 fits in 64 bits).
AGENTKV_SAMPLE_HD inline unsigned long long SampleFixed(float w) {
#if defined(__CUDA_ARCH__)
  return __float2ull_rn(w * 4398046511104.0f);
#else
  return static_cast<unsigned long long>(std::nearbyint(w * 4398046511104.0f));
#endif
}

// top_p's need: ceil(top_p * total) of the kept tokens' total mass, in
// fixed point (the CPU's "at least top_p times their total").
AGENTKV_SAMPLE_HD inline unsigned long long SampleTopPNeed(float top_p, unsigned long long total) {
  return static_cast<unsigned long long>(
      ceil(static_cast<double>(top_p) * static_cast<double>(total)));
}

// The bin a level's scan picks, and the count and mass of the kept tokens
// above it (in higher bins or above the level's range).
struct SampleBinPick {
  int bin = -1;
  unsigned long long above_cnt = 0, above_mass = 0, bin_cnt = 0;
};

// One scanner's two adjacent bins b0 and b0 + 1 (count c, mass q each);
// sc, sq: the count and mass above b0 + 1. The boundary's bin is the
// highest bin whose tokens and those above it reach `need` (count by_count,
// else mass) while those above it alone do not; returns whether it is one
// of these two (exactly one scanner's is, when the level's total reaches
// the need), filling `pick`.
AGENTKV_SAMPLE_HD inline bool SamplePickBin(int b0, unsigned long long c0, unsigned long long c1,
                                            unsigned long long q0, unsigned long long q1,
                                            unsigned long long sc, unsigned long long sq,
                                            unsigned long long need, bool by_count,
                                            SampleBinPick* pick) {
  auto reaches = [&](unsigned long long cnt, unsigned long long mass) {
    return (by_count ? cnt : mass) >= need;
  };
  if (reaches(sc + c1, sq + q1) && !reaches(sc, sq)) {
    pick->bin = b0 + 1;
    pick->above_cnt = sc;
    pick->above_mass = sq;
    pick->bin_cnt = c1;
    return true;
  }
  if (reaches(sc + c1 + c0, sq + q1 + q0) && !reaches(sc + c1, sq + q1)) {
    pick->bin = b0;
    pick->above_cnt = sc + c1;
    pick->above_mass = sq + q1;
    pick->bin_cnt = c0;
    return true;
  }
  return false;
}

// How many of the eq_cnt kept ties at the top_p boundary (each of mass qv)
// the nucleus takes, in id order: the fewest that bring the mass above
// them, gt_mass (< need), to the need; at least 1, all of them where qv is
// 0 (cannot happen for a boundary the search found) or the count exceeds
// theirs.
AGENTKV_SAMPLE_HD inline unsigned long long SampleTopPTies(unsigned long long need,
                                                           unsigned long long gt_mass,
                                                           unsigned long long qv,
                                                           unsigned long long eq_cnt) {
  unsigned long long n = qv > 0ull ? (need - gt_mass + qv - 1ull) / qv : eq_cnt;
  if (n < 1ull) n = 1ull;
  return n < eq_cnt ? n : eq_cnt;
}

}  // namespace agentkv::backend::cuda::kernels
