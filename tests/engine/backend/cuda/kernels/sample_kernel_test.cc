// LaunchSampleRows against SampleDraw, its CPU reference, on random logits
// (a 151,936 vocabulary and a small odd one; batches of 1 and 64; random
// temperature, top_k, top_p, min_p and u per row; peaked, flat, tied and
// non-finite rows) with the output poisoned before the launch.
//
// Tolerance: the kernel's expf and summation order differ from the CPU's by
// rounding (expf within 2 ulp, so a weight moves by ~2.4e-7 of itself at
// most), so a row whose CPU pick changes when u, top_p or min_p moves by
// 1e-6 of itself is "ambiguous": its target sits within rounding of a
// boundary. Every other row must give exactly the CPU's token; ambiguous
// rows are counted and allowed up to a quarter of the rows (flat rows over a
// large vocabulary have tokens of ~1e-5 of the mass each, so a few fall
// there).
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/cuda/kernels/sample_kernel.h"
#include "engine/backend/sample_draw.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

constexpr double kEps = 1e-6;

std::vector<float> RowLogits(int vocab, int kind, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = nd(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  switch (kind % 5) {
    case 0:  // peaked: a handful of tokens carry most of the mass
      for (int i = 0; i < 8; ++i) l[static_cast<size_t>(id(rng))] += 10.f + i;
      break;
    case 1:  // flat
      break;
    case 2:  // coarse values: many exact ties (top_k / top_p boundaries)
      for (float& x : l) x = std::round(x * 2.f) / 2.f;
      break;
    case 3: {  // NaN and -inf tokens in a finite row
      for (int i = 0; i < vocab / 10; ++i) {
        l[static_cast<size_t>(id(rng))] = std::numeric_limits<float>::quiet_NaN();
        l[static_cast<size_t>(id(rng))] = -std::numeric_limits<float>::infinity();
      }
      l[static_cast<size_t>(id(rng))] += 6.f;
      break;
    }
    default:  // peaked and tied
      for (float& x : l) x = std::round(x);
      for (int i = 0; i < 3; ++i) l[static_cast<size_t>(id(rng))] = 9.f;
      break;
  }
  return l;
}

SampleSettings RandomSettings(int vocab, std::mt19937& rng) {
  std::uniform_real_distribution<double> un(0.0, 1.0);
  SampleSettings s;
  s.temperature = static_cast<float>(0.2 + 1.8 * un(rng));
  const double k = un(rng);
  s.top_k = k < 0.4   ? 0
            : k < 0.7 ? 1 + static_cast<int>(un(rng) * 100)
            : k < 0.9 ? 1 + static_cast<int>(un(rng) * vocab)
                      : vocab + 3;  // at or beyond the vocabulary: off
  s.top_p = un(rng) < 0.4 ? 1.0f : static_cast<float>(0.3 + 0.69 * un(rng));
  s.min_p = un(rng) < 0.5 ? 0.0f : static_cast<float>(0.2 * un(rng));
  s.u = un(rng);
  return s;
}

int32_t Cpu(const std::vector<float>& logits, const SampleSettings& s) {
  std::vector<float> buf = logits;
  return SampleDraw(buf, s);
}

// Whether the CPU's pick moves when u, top_p or min_p move by kEps of
// themselves.
bool Ambiguous(const std::vector<float>& logits, const SampleSettings& s, int32_t pick) {
  for (double f : {1.0 - kEps, 1.0 + kEps}) {
    SampleSettings t = s;
    t.u = std::min(s.u * f, std::nextafter(1.0, 0.0));
    if (Cpu(logits, t) != pick) return true;
    t = s;
    if (s.top_p < 1.0f) {
      t.top_p = static_cast<float>(std::min(1.0, s.top_p * f));
      if (Cpu(logits, t) != pick) return true;
    }
    t = s;
    if (s.min_p > 0.0f) {
      t.min_p = static_cast<float>(std::min(1.0, s.min_p * f));
      if (Cpu(logits, t) != pick) return true;
    }
  }
  return false;
}

TEST(SampleKernel, MatchesTheCpuDraw) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(29);
  int rows_total = 0, ambiguous = 0, mismatched = 0;
  for (int vocab : {151936, 1001}) {
    for (int batch : {1, 64}) {
      for (int rep = 0; rep < (batch == 1 ? 8 : 2); ++rep) {
        std::vector<float> logits;
        std::vector<std::vector<float>> rows;
        std::vector<RowPick> picks(static_cast<size_t>(batch));
        for (int r = 0; r < batch; ++r) {
          rows.push_back(RowLogits(vocab, r + rep, rng));
          logits.insert(logits.end(), rows.back().begin(), rows.back().end());
          picks[r].mode = PickMode::kDevice;
          picks[r].sample = RandomSettings(vocab, rng);
        }
        if (batch > 1) {
          // Rows the kernel must leave alone, and the edge cases.
          picks[5].mode = PickMode::kGreedy;
          picks[6].mode = PickMode::kHost;
          std::fill(rows[7].begin(), rows[7].end(), -std::numeric_limits<float>::infinity());
          std::fill(rows[8].begin(), rows[8].end(), std::numeric_limits<float>::quiet_NaN());
          rows[8][vocab / 2] = 1.0f;
          picks[9].sample.temperature = 1e-30f;   // only the best token keeps weight
          picks[10].sample.temperature = 1e-45f;  // 1 / T overflows: the argmax
          picks[11].sample.u = 0.0;
          picks[12].sample.u = std::nextafter(1.0, 0.0);
          picks[13].sample.top_k = 1;
          for (int r : {7, 8})
            std::copy(rows[r].begin(), rows[r].end(), logits.begin() + int64_t{r} * vocab);
        }
        auto dl = Upload(logits);
        auto dp = Upload(picks);
        auto out = Poisoned<int32_t>(static_cast<size_t>(batch));
        ASSERT_EQ(LaunchSampleRows(dl.get<float>(), batch, vocab, dp.get<RowPick>(),
                                   out.get<int32_t>(), nullptr),
                  cudaSuccess);
        const std::vector<int32_t> got = Download<int32_t>(out, static_cast<size_t>(batch));
        for (int r = 0; r < batch; ++r) {
          if (picks[r].mode != PickMode::kDevice) {
            EXPECT_EQ(got[r], -1) << "row " << r << " is not the kernel's";
            continue;
          }
          ++rows_total;
          const int32_t want = Cpu(rows[r], picks[r].sample);
          ASSERT_GE(got[r], 0) << "row " << r << " not written";
          ASSERT_LT(got[r], vocab);
          if (got[r] == want) continue;
          if (Ambiguous(rows[r], picks[r].sample, want)) {
            ++ambiguous;
            continue;
          }
          ++mismatched;
          const SampleSettings& s = picks[r].sample;
          ADD_FAILURE() << "vocab " << vocab << " batch " << batch << " row " << r << ": gpu "
                        << got[r] << " cpu " << want << " (T " << s.temperature << " top_k "
                        << s.top_k << " top_p " << s.top_p << " min_p " << s.min_p << " u " << s.u
                        << ")";
        }
        if (batch > 1) {
          EXPECT_EQ(got[7], 0);  // all -inf
          EXPECT_EQ(got[8], vocab / 2);
          EXPECT_EQ(got[13], Cpu(rows[13], picks[13].sample));
        }
      }
    }
  }
  std::printf("sample kernel: %d rows, %d ambiguous (within %.0e of a boundary), %d mismatched\n",
              rows_total, ambiguous, kEps, mismatched);
  EXPECT_EQ(mismatched, 0);
  EXPECT_LE(ambiguous * 4, rows_total);
}

// u swept over [0, 1) (midpoints of 512 steps) on one small row with every
// filter on: the kernel picks what the CPU picks, so it draws each kept
// token in proportion to its weight; and the same inputs give the same
// picks on every launch.
TEST(SampleKernel, SweepOfUMatchesTheCpuExactly) {
  AGENTKV_REQUIRE_GPU();
  const int vocab = 37, n = 512;
  std::vector<float> row(vocab);
  for (int i = 0; i < vocab; ++i) row[i] = std::sin(1.3f * i) * 3.0f;
  std::vector<float> logits;
  std::vector<RowPick> picks(n);
  for (int r = 0; r < n; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    picks[r].mode = PickMode::kDevice;
    picks[r].sample.temperature = 0.8f;
    picks[r].sample.top_k = 20;
    picks[r].sample.top_p = 0.9f;
    picks[r].sample.min_p = 0.02f;
    picks[r].sample.u = (r + 0.5) / n;  // midpoints: away from every boundary
  }
  auto dl = Upload(logits);
  auto dp = Upload(picks);
  std::vector<int32_t> first;
  for (int launch = 0; launch < 2; ++launch) {
    auto out = Poisoned<int32_t>(n);
    ASSERT_EQ(
        LaunchSampleRows(dl.get<float>(), n, vocab, dp.get<RowPick>(), out.get<int32_t>(), nullptr),
        cudaSuccess);
    const std::vector<int32_t> got = Download<int32_t>(out, n);
    int ambiguous = 0;
    for (int r = 0; r < n; ++r) {
      const int32_t want = Cpu(row, picks[r].sample);
      if (got[r] != want) {
        ASSERT_TRUE(Ambiguous(row, picks[r].sample, want)) << "u " << picks[r].sample.u;
        ++ambiguous;
      }
    }
    EXPECT_LE(ambiguous, 2);
    if (launch == 0) first = got;
    EXPECT_EQ(got, first);
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(SampleKernel, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
