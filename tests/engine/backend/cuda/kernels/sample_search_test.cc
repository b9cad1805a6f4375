// The sampling kernel's decisions (sample_search.h) on the host: no GPU and
// no CUDA toolkit needed. The radix search replayed as the kernel runs it
// (three levels of 1,024 bins, each scanner looking at two adjacent bins,
// the ties at the boundary in id order) must keep exactly the tokens the
// CPU reference keeps (SampleWeights), on rows made of ties, flat, peaked
// and masked logits under top_k, top_p, min_p and temperatures down to
// the one whose inverse overflows; and the cluster size must fill the SMs.
#include "engine/backend/cuda/kernels/sample_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/sample_draw.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using u64 = unsigned long long;

uint32_t Bits(float w) {
  uint32_t b;
  std::memcpy(&b, &w, 4);
  return b;
}

float FromBits(uint32_t b) {
  float w;
  std::memcpy(&w, &b, 4);
  return w;
}

// The tokens kept so far, as the kernel's Bound.
struct Bound {
  bool on = false;
  uint32_t bits = 0;
  int id = 0;
  bool Keeps(uint32_t b, int i) const { return !on || b > bits || (b == bits && i <= id); }
};

struct Found {
  bool found = false;
  uint32_t v = 0;
  u64 gt_cnt = 0, gt_mass = 0, eq_cnt = 0, need = 0;
};

// The kernel's Search, serially: per level, the histogram of the kept
// tokens in range, then each of the 512 scanners' two bins through
// SamplePickBin (exactly one may claim the boundary).
Found Search(const std::vector<float>& w, const Bound& bound, bool by_count, int k, float top_p) {
  Found res;
  u64 need = by_count ? static_cast<u64>(k) : 0;
  uint32_t lo = 0;
  u64 above_cnt = 0, above_mass = 0;
  for (int shift = kSampleTopShift; shift >= 0; shift -= kSampleBinBits) {
    const uint32_t span = static_cast<uint32_t>(kSampleBins) << shift;
    std::vector<u64> cnt(kSampleBins), mass(kSampleBins);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint32_t b = Bits(w[i]);
      if (b - lo >= span || !bound.Keeps(b, static_cast<int>(i))) continue;
      ++cnt[(b - lo) >> shift];
      mass[(b - lo) >> shift] += SampleFixed(w[i]);
    }
    u64 tc = 0, tq = 0;
    for (int j = 0; j < kSampleBins; ++j) {
      tc += cnt[j];
      tq += mass[j];
    }
    if (shift == kSampleTopShift && !by_count) need = SampleTopPNeed(top_p, tq);
    SampleBinPick pick;
    int claims = 0;
    u64 ic = 0, iq = 0;  // inclusive prefix over the scanners
    for (int b0 = 0; b0 < kSampleBins; b0 += 2) {
      ic += cnt[b0] + cnt[b0 + 1];
      iq += mass[b0] + mass[b0 + 1];
      SampleBinPick p;
      if (SamplePickBin(b0, cnt[b0], cnt[b0 + 1], mass[b0], mass[b0 + 1], above_cnt + (tc - ic),
                        above_mass + (tq - iq), need, by_count, &p)) {
        pick = p;
        ++claims;
      }
    }
    EXPECT_LE(claims, 1);
    if (claims == 0) return res;
    above_cnt = pick.above_cnt;
    above_mass = pick.above_mass;
    lo += static_cast<uint32_t>(pick.bin) << shift;
    if (shift == 0) {
      res.found = true;
      res.v = lo;
      res.gt_cnt = above_cnt;
      res.gt_mass = above_mass;
      res.eq_cnt = pick.bin_cnt;
    }
  }
  res.need = need;
  return res;
}

int NthTie(const std::vector<float>& w, uint32_t bits, int n) {
  for (size_t i = 0; i < w.size(); ++i)
    if (Bits(w[i]) == bits && --n == 0) return static_cast<int>(i);
  return -1;
}

// The kernel's kept set: top_k, then top_p, then min_p (nothing kept: the
// CPU's argmax case).
std::vector<bool> KernelKeeps(const std::vector<float>& logits, const SampleSettings& s) {
  const int vocab = static_cast<int>(logits.size());
  float m = -std::numeric_limits<float>::infinity();
  for (float x : logits) m = std::max(m, x);
  const float inv_t = 1.0f / s.temperature;
  std::vector<float> w(logits.size());
  for (int i = 0; i < vocab; ++i) {
    const float x = std::exp((logits[i] - m) * inv_t);
    w[i] = std::isnan(x) ? 0.f : x;
  }
  Bound bound;
  if (s.top_k > 0 && s.top_k < vocab) {
    const Found f = Search(w, bound, true, s.top_k, 1.0f);
    EXPECT_TRUE(f.found);
    const u64 ties = static_cast<u64>(s.top_k) - f.gt_cnt;
    EXPECT_GE(ties, 1u);
    EXPECT_LE(ties, f.eq_cnt);
    bound = {true, f.v, ties >= f.eq_cnt ? vocab : NthTie(w, f.v, static_cast<int>(ties))};
  }
  if (s.top_p < 1.0f) {
    const Found f = Search(w, bound, false, 0, s.top_p);
    if (f.found) {
      EXPECT_LT(f.gt_mass, f.need);
      const u64 ties = SampleTopPTies(f.need, f.gt_mass, SampleFixed(FromBits(f.v)), f.eq_cnt);
      const bool same = bound.on && bound.bits == f.v;
      int id = same ? bound.id : vocab;
      if (ties < f.eq_cnt) {
        const int nth = NthTie(w, f.v, static_cast<int>(ties));
        if (nth >= 0) id = std::min(id, nth);
      }
      bound = {true, f.v, id};
    }
  }
  std::vector<bool> keep(logits.size());
  for (int i = 0; i < vocab; ++i)
    keep[i] = w[i] > 0.f && w[i] >= s.min_p && bound.Keeps(Bits(w[i]), i);
  return keep;
}

TEST(SampleSearch, KeepsWhatTheCpuKeeps) {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.f, 2.f);
  int rows = 0;
  for (int t = 0; t < 600; ++t) {
    const int vocab = std::vector<int>{37, 1001, 5003, 20000}[t % 4];
    const int kind = (t / 4) % 6;
    std::vector<float> l(static_cast<size_t>(vocab));
    for (float& x : l) x = nd(rng);
    switch (kind) {
      case 1:  // coarse: thousands of exact ties
        for (float& x : l) x = std::round(x * 2.f) / 2.f;
        break;
      case 2:  // all equal: every weight is 1
        std::fill(l.begin(), l.end(), 0.f);
        break;
      case 3:  // a single peak
        l[static_cast<size_t>(vocab) / 3] = 40.f;
        break;
      case 4:  // masked tokens
        for (int i = 0; i < vocab; i += 3) l[i] = -std::numeric_limits<float>::infinity();
        l[1] = std::numeric_limits<float>::quiet_NaN();
        break;
      default:  // flat normal
        break;
    }
    std::uniform_int_distribution<int> pick(0, 6);
    SampleSettings s;
    s.temperature = std::vector<float>{1.0f, 0.7f, 0.2f, 1.9f, 1e-30f, 1e-45f, 1.0f}[pick(rng)];
    s.top_k = std::vector<int>{0, 1, 5, 50, vocab - 1, vocab, vocab / 2 + 3}[pick(rng)];
    s.top_p = std::vector<float>{1.0f, 0.9f, 0.5f, 1e-6f, 0.3f, 0.99f, 0.7f}[pick(rng)];
    s.min_p = std::vector<float>{0.f, 0.f, 0.f, 0.05f, 0.1f, 0.f, 0.f}[pick(rng)];
    std::vector<float> cpu = l;
    const int32_t point = SampleWeights(cpu, s);
    const std::vector<bool> got = KernelKeeps(l, s);
    ++rows;
    int differ = 0;
    for (int i = 0; i < vocab; ++i) differ += got[i] != (point < 0 && cpu[i] > 0.f);
    EXPECT_EQ(differ, 0) << "vocab " << vocab << " kind " << kind << " T " << s.temperature
                         << " top_k " << s.top_k << " top_p " << s.top_p << " min_p " << s.min_p;
  }
  EXPECT_EQ(rows, 600);
}

// The scan's claim: only the bin where the running total crosses the need,
// and none when the level's total falls short of it.
TEST(SampleSearch, OnlyTheCrossingBinIsClaimed) {
  SampleBinPick p;
  // Bins 4 and 5 hold 3 and 2 tokens; 6 lie above bin 5. Need 10: bin 4
  // (8 above it, 11 with it).
  ASSERT_TRUE(SamplePickBin(4, 3, 2, 0, 0, 6, 0, 10, true, &p));
  EXPECT_EQ(p.bin, 4);
  EXPECT_EQ(p.above_cnt, 8u);
  EXPECT_EQ(p.bin_cnt, 3u);
  // Need 8: bin 5 (6 above it, 8 with it).
  ASSERT_TRUE(SamplePickBin(4, 3, 2, 0, 0, 6, 0, 8, true, &p));
  EXPECT_EQ(p.bin, 5);
  EXPECT_EQ(p.above_cnt, 6u);
  EXPECT_EQ(p.bin_cnt, 2u);
  // Need 6: reached above both bins: neither.
  EXPECT_FALSE(SamplePickBin(4, 3, 2, 0, 0, 6, 0, 6, true, &p));
  // Need 12: not reached even with both.
  EXPECT_FALSE(SamplePickBin(4, 3, 2, 0, 0, 6, 0, 12, true, &p));
  // By mass, a bin of tokens whose mass rounds to 0 never holds it.
  EXPECT_FALSE(SamplePickBin(4, 5, 0, 0, 0, 0, 10, 11, false, &p));
  ASSERT_TRUE(SamplePickBin(4, 5, 0, 7, 0, 0, 10, 11, false, &p));
  EXPECT_EQ(p.bin, 4);
  EXPECT_EQ(p.above_mass, 10u);
}

TEST(SampleSearch, FixedPointAndTopPTies) {
  EXPECT_EQ(SampleFixed(1.0f), 1ull << 42);
  EXPECT_EQ(SampleFixed(0.0f), 0u);
  EXPECT_EQ(SampleFixed(0.5f), 1ull << 41);
  EXPECT_EQ(SampleFixed(1e-20f), 0u);  // below 2^-43: no mass
  EXPECT_EQ(SampleTopPNeed(0.5f, 10), 5u);
  EXPECT_EQ(SampleTopPNeed(0.9f, 10), 9u);
  EXPECT_EQ(SampleTopPNeed(0.25f, 10), 3u);  // ceil: at least top_p of it
  // 10 above, need 25, ties of 4: ceil(15 / 4) = 4 of the 6.
  EXPECT_EQ(SampleTopPTies(25, 10, 4, 6), 4u);
  EXPECT_EQ(SampleTopPTies(25, 10, 4, 3), 3u);  // capped at the ties there are
  EXPECT_EQ(SampleTopPTies(25, 24, 4, 6), 1u);
  EXPECT_EQ(SampleTopPTies(25, 10, 0, 6), 6u);  // massless ties: all
}

// Blocks per row: a step's rows spread over the SMs, up to 8 blocks (the
// portable cluster), one before Hopper.
TEST(SampleSearch, ClusterSizeFillsTheSms) {
  EXPECT_EQ(SampleClusterSize(1, 132, 9), 8);
  EXPECT_EQ(SampleClusterSize(8, 132, 9), 8);
  EXPECT_EQ(SampleClusterSize(33, 132, 9), 4);
  EXPECT_EQ(SampleClusterSize(64, 132, 9), 2);
  EXPECT_EQ(SampleClusterSize(66, 132, 9), 2);
  EXPECT_EQ(SampleClusterSize(67, 132, 9), 1);
  EXPECT_EQ(SampleClusterSize(512, 132, 9), 1);
  EXPECT_EQ(SampleClusterSize(1, 108, 8), 1);  // no clusters before Hopper
  EXPECT_EQ(SampleClusterSize(0, 132, 9), 1);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels
