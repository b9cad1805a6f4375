// LaunchSampleRows against SampleDraw and VerifyDraftRow (drafted rows),
// its CPU references, on random logits
// (a 151,936 vocabulary and a small odd one; batches of 1 and 64; random
// temperature, top_k, top_p, min_p and u per row; peaked, flat, tied and
// non-finite rows), and on the settings at the edges of the boundary
// search (top_k 1, vocab - 1 and vocab, top_p 1 and tiny, min_p with top_p,
// boundaries inside runs of ties, a 262,144 vocabulary), with the output
// poisoned before the launch.
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

// The kernel's picks for `rows` rows of `logits` under `picks` (into a
// poisoned output; cluster 0 lets the launcher choose), or an empty vector
// when the launch fails (a test failure).
std::vector<int32_t> Picks(const std::vector<float>& logits, const std::vector<RowPick>& picks,
                           int rows, int vocab, int cluster = 0) {
  auto dl = Upload(logits);
  auto dp = Upload(picks);
  auto out = Poisoned<int32_t>(static_cast<size_t>(rows));
  const cudaError_t e = LaunchSampleRows(dl.get<float>(), rows, vocab, dp.get<RowPick>(),
                                         out.get<int32_t>(), nullptr, cluster);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  if (e != cudaSuccess) return {};
  return Download<int32_t>(out, static_cast<size_t>(rows));
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
        const std::vector<int32_t> got = Picks(logits, picks, batch, vocab);
        ASSERT_EQ(got.size(), static_cast<size_t>(batch));
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

// The edges of the radix search, on rows made to hit them: a row of equal
// logits (every weight is 1: top_k and top_p boundaries fall inside one run
// of ties, kept in id order), coarse logits (a few values, thousands of
// tokens each), a flat random row and a single peak (tiny top_p keeps the
// best token alone), under each of the settings below, at the Llama 3
// vocabulary and a 262,144 one (three histogram levels all in use).
TEST(SampleKernel, EdgesOfTheBoundarySearchMatchTheCpu) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> un(0.0, 1.0);
  for (int vocab : {128256, 262144}) {
    std::vector<SampleSettings> settings;
    auto add = [&](float t, int k, float p, float mp) {
      SampleSettings s;
      s.temperature = t;
      s.top_k = k;
      s.top_p = p;
      s.min_p = mp;
      settings.push_back(s);
    };
    add(1.0f, 1, 1.0f, 0.0f);              // top_k 1: the argmax
    add(1.0f, vocab, 1.0f, 0.0f);          // top_k = vocab: off
    add(1.0f, vocab - 1, 1.0f, 0.0f);      // all but the last of the order
    add(1.0f, 50, 1.0f, 0.0f);             // the usual top_k
    add(1.0f, 5000, 1.0f, 0.0f);           // a boundary deep in the row
    add(1.0f, 0, 1.0f, 0.1f);              // top_p 1 (off) with min_p
    add(1.0f, 0, 1e-6f, 0.0f);             // tiny top_p: the best token(s)
    add(1.0f, 0, 0.5f, 0.0f);              // a boundary in the bulk
    add(1.0f, 0, 0.99f, 0.05f);            // min_p cuts inside the nucleus
    add(0.7f, 50, 0.9f, 0.05f);            // all four, as clients send them
    add(1.0f, 2000, 0.3f, 0.0f);           // top_p inside a large top_k set
    add(0.2f, 0, 0.95f, 0.0f);             // low temperature: most weights 0
    add(1.0f, vocab / 2 + 7, 0.7f, 0.0f);  // both boundaries in ties
    std::vector<std::vector<float>> kinds;
    kinds.emplace_back(static_cast<size_t>(vocab), 0.0f);  // all equal
    {
      std::normal_distribution<float> nd(0.f, 2.f);
      std::vector<float> coarse(static_cast<size_t>(vocab)), flat(static_cast<size_t>(vocab));
      for (float& x : flat) x = nd(rng);
      for (size_t i = 0; i < coarse.size(); ++i) coarse[i] = std::round(flat[i]);
      std::vector<float> peak = flat;
      peak[static_cast<size_t>(vocab) / 3] = 40.0f;
      kinds.push_back(coarse);
      kinds.push_back(flat);
      kinds.push_back(peak);
    }
    const int rows = static_cast<int>(kinds.size() * settings.size());
    std::vector<float> logits;
    logits.reserve(static_cast<size_t>(rows) * vocab);
    std::vector<RowPick> picks(static_cast<size_t>(rows));
    std::vector<const std::vector<float>*> row_of(static_cast<size_t>(rows));
    int r = 0;
    for (const auto& kind : kinds) {
      for (const SampleSettings& s : settings) {
        logits.insert(logits.end(), kind.begin(), kind.end());
        picks[r].mode = PickMode::kDevice;
        picks[r].sample = s;
        picks[r].sample.u = un(rng);
        row_of[r] = &kind;
        ++r;
      }
    }
    std::vector<int32_t> want(static_cast<size_t>(rows));
    for (r = 0; r < rows; ++r) want[r] = Cpu(*row_of[r], picks[r].sample);
    auto dl = Upload(logits);
    auto dp = Upload(picks);
    // The device's own cluster size (0), one block per row, an odd split
    // and the largest cluster: the blocks of a row must agree whatever
    // their number.
    for (int cluster : {0, 1, 3, 8}) {
      auto out = Poisoned<int32_t>(static_cast<size_t>(rows));
      ASSERT_EQ(LaunchSampleRows(dl.get<float>(), rows, vocab, dp.get<RowPick>(),
                                 out.get<int32_t>(), nullptr, cluster),
                cudaSuccess);
      const std::vector<int32_t> got = Download<int32_t>(out, static_cast<size_t>(rows));
      int ambiguous = 0;
      for (r = 0; r < rows; ++r) {
        const SampleSettings& s = picks[r].sample;
        ASSERT_GE(got[r], 0) << "row " << r << " not written, cluster " << cluster;
        ASSERT_LT(got[r], vocab);
        if (got[r] == want[r]) continue;
        if (Ambiguous(*row_of[r], s, want[r])) {
          ++ambiguous;
          continue;
        }
        ADD_FAILURE() << "vocab " << vocab << " cluster " << cluster << " row kind "
                      << r / settings.size() << ": gpu " << got[r] << " cpu " << want[r] << " (T "
                      << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p << " min_p "
                      << s.min_p << " u " << s.u << ")";
      }
      // top_k 1 is the argmax whatever u is; so is a tiny top_p over a
      // single peak.
      const size_t n = settings.size();
      for (size_t kind = 0; kind < kinds.size(); ++kind)
        EXPECT_EQ(got[kind * n], want[kind * n]) << "kind " << kind;
      EXPECT_EQ(got[3 * n + 6], vocab / 3);
      // On the equal row every weight is 1: top_k 50 keeps ids 0..49.
      EXPECT_LT(got[3], 50);
      EXPECT_LE(ambiguous * 4, rows) << ambiguous << " of " << rows << " rows near a boundary";
    }
  }
}

// A cluster larger than the portable 8 is refused, not launched.
TEST(SampleKernel, RefusesAClusterAboveEight) {
  AGENTKV_REQUIRE_GPU();
  const int vocab = 64;
  std::vector<float> logits(vocab, 0.0f);
  std::vector<RowPick> picks(1);
  picks[0].mode = PickMode::kDevice;
  auto dl = Upload(logits);
  auto dp = Upload(picks);
  auto out = Poisoned<int32_t>(1);
  EXPECT_EQ(LaunchSampleRows(dl.get<float>(), 1, vocab, dp.get<RowPick>(), out.get<int32_t>(),
                             nullptr, 9),
            cudaErrorInvalidValue);
  EXPECT_EQ(Download<int32_t>(out, 1)[0], -1);
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

// Drafted rows (RowPick::draft): VerifyDraftRow on the CPU.
int32_t CpuVerify(const std::vector<float>& logits, const RowPick& p) {
  std::vector<float> buf = logits;
  return VerifyDraftRow(buf, p.sample, p.draft, p.u_accept);
}

// Whether the CPU's verdict moves when u_accept, u, top_p or min_p move by
// kEps of themselves.
bool AmbiguousVerify(const std::vector<float>& logits, const RowPick& p, int32_t pick) {
  for (double f : {1.0 - kEps, 1.0 + kEps}) {
    RowPick t = p;
    t.u_accept = std::min(p.u_accept * f, std::nextafter(1.0, 0.0));
    if (CpuVerify(logits, t) != pick) return true;
    t = p;
    t.sample.u = std::min(p.sample.u * f, std::nextafter(1.0, 0.0));
    if (CpuVerify(logits, t) != pick) return true;
    t = p;
    if (p.sample.top_p < 1.0f) {
      t.sample.top_p = static_cast<float>(std::min(1.0, p.sample.top_p * f));
      if (CpuVerify(logits, t) != pick) return true;
    }
    t = p;
    if (p.sample.min_p > 0.0f) {
      t.sample.min_p = static_cast<float>(std::min(1.0, p.sample.min_p * f));
      if (CpuVerify(logits, t) != pick) return true;
    }
  }
  return false;
}

// The kernel's speculative test against VerifyDraftRow for identical
// uniforms: the same acceptance decision and, where rejected, the same
// residual draw, on the rows and settings of MatchesTheCpuDraw, with draft
// tokens that are likely (the CPU's own draw), the argmax, random, and
// outside the vocabulary. Tolerance as above.
TEST(SampleKernel, DraftVerificationMatchesTheCpu) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> un(0.0, 1.0);
  int rows_total = 0, ambiguous = 0, mismatched = 0, accepted = 0;
  for (int vocab : {151936, 1001}) {
    std::uniform_int_distribution<int> id(0, vocab - 1);
    for (int rep = 0; rep < 3; ++rep) {
      const int batch = 64;
      std::vector<float> logits;
      std::vector<std::vector<float>> rows;
      std::vector<RowPick> picks(static_cast<size_t>(batch));
      for (int r = 0; r < batch; ++r) {
        rows.push_back(RowLogits(vocab, r + rep, rng));
        logits.insert(logits.end(), rows.back().begin(), rows.back().end());
        RowPick& p = picks[static_cast<size_t>(r)];
        p.mode = PickMode::kDevice;
        p.sample = RandomSettings(vocab, rng);
        p.u_accept = un(rng);
        switch (r % 4) {
          case 0: {  // likely: what the row itself draws with another u
            SampleSettings t = p.sample;
            t.u = un(rng);
            p.draft = Cpu(rows.back(), t);
            break;
          }
          case 1:
            p.draft = static_cast<int32_t>(
                std::max_element(rows.back().begin(), rows.back().end()) - rows.back().begin());
            break;
          case 2:
            p.draft = id(rng);
            break;
          default:
            p.draft = vocab + 2;  // never accepted
        }
      }
      picks[5].u_accept = 0.0;                       // accepted wherever p(d) > 0
      picks[6].u_accept = std::nextafter(1.0, 0.0);  // rejected unless p(d) = 1
      picks[7].sample.top_k = 1;                     // a single kept token
      picks[9].mode = PickMode::kHost;               // not the kernel's row
      const std::vector<int32_t> got = Picks(logits, picks, batch, vocab);
      ASSERT_EQ(got.size(), static_cast<size_t>(batch));
      for (int r = 0; r < batch; ++r) {
        const RowPick& p = picks[static_cast<size_t>(r)];
        if (p.mode != PickMode::kDevice) {
          EXPECT_EQ(got[r], -1) << "row " << r << " is not the kernel's";
          continue;
        }
        ++rows_total;
        const int32_t want = CpuVerify(rows[static_cast<size_t>(r)], p);
        ASSERT_GE(got[r], 0) << "row " << r << " not written";
        ASSERT_LT(got[r], vocab);
        if (want == p.draft) ++accepted;
        if (p.draft >= vocab) {
          EXPECT_NE(got[r], p.draft);
        }
        if (got[r] == want) continue;
        if (AmbiguousVerify(rows[static_cast<size_t>(r)], p, want)) {
          ++ambiguous;
          continue;
        }
        ++mismatched;
        ADD_FAILURE() << "vocab " << vocab << " row " << r << ": gpu " << got[r] << " cpu " << want
                      << " draft " << p.draft << " (u_accept " << p.u_accept << " T "
                      << p.sample.temperature << " top_k " << p.sample.top_k << " top_p "
                      << p.sample.top_p << " min_p " << p.sample.min_p << " u " << p.sample.u
                      << ")";
      }
    }
  }
  std::printf("draft verification: %d rows, %d accepted, %d ambiguous, %d mismatched\n", rows_total,
              accepted, ambiguous, mismatched);
  EXPECT_EQ(mismatched, 0);
  EXPECT_LE(ambiguous * 4, rows_total);
  EXPECT_GE(accepted * 10, rows_total) << "too few accepted drafts to test acceptance";
}

// u_accept swept over [0, 1) (midpoints of 512 steps) for one draft token
// of a small row with every filter on: the kernel accepts exactly where the
// CPU does (u_accept < p(d)), so about p(d) of the sweep, and draws the
// residual the CPU draws elsewhere.
TEST(SampleKernel, SweepOfTheAcceptanceUniformMatchesTheCpu) {
  AGENTKV_REQUIRE_GPU();
  const int vocab = 37, n = 512;
  std::vector<float> row(vocab);
  for (int i = 0; i < vocab; ++i) row[i] = std::sin(1.3f * i) * 3.0f;
  const int32_t d = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  std::vector<float> logits;
  std::vector<RowPick> picks(n);
  for (int r = 0; r < n; ++r) {
    logits.insert(logits.end(), row.begin(), row.end());
    RowPick& p = picks[static_cast<size_t>(r)];
    p.mode = PickMode::kDevice;
    p.sample.temperature = 0.8f;
    p.sample.top_k = 20;
    p.sample.top_p = 0.9f;
    p.sample.min_p = 0.02f;
    p.sample.u = (r % 7 + 0.5) / 7;
    p.draft = d;
    p.u_accept = (r + 0.5) / n;
  }
  auto dl = Upload(logits);
  auto dp = Upload(picks);
  auto out = Poisoned<int32_t>(n);
  ASSERT_EQ(
      LaunchSampleRows(dl.get<float>(), n, vocab, dp.get<RowPick>(), out.get<int32_t>(), nullptr),
      cudaSuccess);
  const std::vector<int32_t> got = Download<int32_t>(out, n);
  int gpu_accepted = 0, cpu_accepted = 0, ambiguous = 0;
  for (int r = 0; r < n; ++r) {
    const int32_t want = CpuVerify(row, picks[static_cast<size_t>(r)]);
    gpu_accepted += got[r] == d;
    cpu_accepted += want == d;
    if (got[r] != want) {
      ASSERT_TRUE(AmbiguousVerify(row, picks[static_cast<size_t>(r)], want))
          << "u_accept " << picks[static_cast<size_t>(r)].u_accept;
      ++ambiguous;
    }
  }
  std::printf("acceptance sweep: cpu %d, gpu %d of %d accepted\n", cpu_accepted, gpu_accepted, n);
  EXPECT_LE(ambiguous, 2);
  EXPECT_GT(cpu_accepted, 0);
  EXPECT_LT(cpu_accepted, n);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(SampleKernel, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
