// Verifying speculative drafts: greedy acceptance and rejection sampling
// that keeps the target distribution.
#include "engine/draft_verify.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/backend/sample_draw.h"

namespace agentkv::engine {
namespace {

using V = std::vector<int32_t>;
using backend::PickMode;
using backend::RowPick;
using backend::SampleSettings;
using backend::SampleWeights;
using backend::VerifyDraftRow;

TEST(DraftVerifyTest, GreedyAcceptsTheAgreeingPrefixAndTheNextArgmax) {
  // picks = argmax of rows 0..3 for a draft of three.
  EXPECT_EQ(VerifyGreedyDraft(V{5, 6, 7}, V{5, 6, 7, 8}).accepted, 3);
  EXPECT_EQ(VerifyGreedyDraft(V{5, 6, 7}, V{5, 6, 7, 8}).next, 8);  // bonus token
  EXPECT_EQ(VerifyGreedyDraft(V{5, 6, 7}, V{5, 9, 7, 8}).accepted, 1);
  EXPECT_EQ(VerifyGreedyDraft(V{5, 6, 7}, V{5, 9, 7, 8}).next, 9);  // the correction
  EXPECT_EQ(VerifyGreedyDraft(V{5, 6, 7}, V{1, 6, 7, 8}).accepted, 0);
  EXPECT_EQ(VerifyGreedyDraft(V{5, 6, 7}, V{1, 6, 7, 8}).next, 1);
  EXPECT_EQ(VerifyGreedyDraft(V{}, V{4}).accepted, 0);
  EXPECT_EQ(VerifyGreedyDraft(V{}, V{4}).next, 4);
}

// The reference distribution, computed directly: softmax(l / T) over the
// top_k largest logits.
std::vector<double> Target(const std::vector<float>& l, float t, int top_k) {
  std::vector<double> p(l.size(), 0.0);
  std::vector<float> sorted = l;
  std::sort(sorted.rbegin(), sorted.rend());
  const float cut = top_k > 0 ? sorted[static_cast<size_t>(top_k - 1)] : -INFINITY;
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i] >= cut) sum += p[i] = std::exp((l[i] - sorted[0]) / t);
  for (double& x : p) x /= sum;
  return p;
}

struct Lcg {  // deterministic uniforms for the test (64-bit LCG, top 53 bits)
  uint64_t x = 0x243f6a8885a308d3ull;
  double operator()() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  }
};

// Each emitted token is distributed as a plain draw from its row: the first
// as p0 whatever the draft; the second, given the first draft token was
// accepted, as p1. 200k trials: the frequencies' standard deviation is
// below 0.0012, the tolerance 0.01; the uniforms are fixed, so the test
// gives the same counts on every run.
void CheckDistribution(float temperature, int top_k) {
  const int32_t vocab = 6;
  const std::vector<float> row0 = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f};
  const std::vector<float> row1 = {0.2f, 0.1f, 3.0f, 2.9f, 0.0f, 1.0f};
  const std::vector<float> row2 = {2.0f, 1.0f, 0.5f, 0.0f, 1.5f, 0.0f};
  const V draft = {3, 2};  // neither is row 0's most likely token
  const std::vector<double> p0 = Target(row0, temperature, top_k);
  const std::vector<double> p1 = Target(row1, temperature, top_k);
  SampleSettings s;
  s.temperature = temperature;
  s.top_k = top_k;
  Lcg rng;
  const int trials = 200000;
  std::vector<double> first(vocab, 0), second(vocab, 0);
  int accepted_first = 0;
  std::vector<float> rows;
  for (int i = 0; i < trials; ++i) {
    rows = row0;
    rows.insert(rows.end(), row1.begin(), row1.end());
    rows.insert(rows.end(), row2.begin(), row2.end());
    const DraftVerdict v = VerifySampledDraft(draft, rows, vocab, s, [&] { return rng(); });
    ASSERT_GE(v.accepted, 0);
    ASSERT_LE(v.accepted, 2);
    const int32_t t0 = v.accepted >= 1 ? draft[0] : v.next;
    first[static_cast<size_t>(t0)] += 1;
    if (v.accepted >= 1) {
      ++accepted_first;
      const int32_t t1 = v.accepted >= 2 ? draft[1] : v.next;
      second[static_cast<size_t>(t1)] += 1;
    }
  }
  ASSERT_GT(accepted_first, 10000);
  for (int32_t t = 0; t < vocab; ++t) {
    EXPECT_NEAR(first[static_cast<size_t>(t)] / trials, p0[static_cast<size_t>(t)], 0.01) << t;
    EXPECT_NEAR(second[static_cast<size_t>(t)] / accepted_first, p1[static_cast<size_t>(t)], 0.01)
        << t;
  }
}

TEST(DraftVerifyTest, SampledOutputKeepsTheTargetDistribution) { CheckDistribution(0.8f, 0); }

TEST(DraftVerifyTest, SampledOutputKeepsTheTruncatedDistribution) {
  // top_k 3: the draft's second token (2) is kept in row 1, the first (3)
  // in row 0; tokens outside the top 3 never appear.
  CheckDistribution(1.0f, 3);
}

TEST(DraftVerifyTest, ADraftTokenOutsideTheKeptSetIsAlwaysRejected) {
  const std::vector<float> row0 = {5.0f, 4.0f, -3.0f};
  const std::vector<float> row1 = {0.0f, 0.0f, 0.0f};
  SampleSettings s;
  s.top_k = 2;
  Lcg rng;
  for (int i = 0; i < 1000; ++i) {
    std::vector<float> rows = row0;
    rows.insert(rows.end(), row1.begin(), row1.end());
    const DraftVerdict v = VerifySampledDraft(V{2}, rows, 3, s, [&] { return rng(); });
    ASSERT_EQ(v.accepted, 0);
    ASSERT_NE(v.next, 2);
  }
}

TEST(DraftVerifyTest, APointMassRowAcceptsOnlyItsToken) {
  // +inf logit: SampleDraw's pick whatever u is.
  std::vector<float> rows = {0.0f, INFINITY, 0.0f, 1.0f, 2.0f, 3.0f};
  SampleSettings s;
  Lcg rng;
  DraftVerdict v = VerifySampledDraft(V{0}, rows, 3, s, [&] { return rng(); });
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 1);
  rows = {0.0f, INFINITY, 0.0f, 1.0f, 2.0f, 3.0f};
  v = VerifySampledDraft(V{1}, rows, 3, s, [&] { return rng(); });
  EXPECT_EQ(v.accepted, 1);
}

// The random stream does not depend on the outcome: 2k + 1 uniforms per
// drafted step, accepted or not (so a seeded request draws the same
// uniforms on every backend).
TEST(DraftVerifyTest, ADraftedStepTakesTwoUniformsPerDraftTokenPlusOne) {
  const std::vector<float> row = {0.0f, 3.0f, 1.0f, -1.0f};
  SampleSettings s;
  for (const V& draft : {V{1, 1, 1}, V{3, 3, 3}, V{}, V{1, 3}}) {
    for (double fixed : {0.0, 0.5, 0.999}) {
      std::vector<float> rows;
      for (size_t j = 0; j <= draft.size(); ++j) rows.insert(rows.end(), row.begin(), row.end());
      int calls = 0;
      VerifySampledDraft(draft, rows, 4, s, [&] {
        ++calls;
        return fixed;
      });
      EXPECT_EQ(calls, 2 * static_cast<int>(draft.size()) + 1) << draft.size() << " " << fixed;
    }
  }
}

// What a backend is handed for a sampled drafted step: row j tests draft[j]
// with the first uniform of its pair and draws its residual with the
// second; the last row draws with the last uniform.
TEST(DraftVerifyTest, PlanSampledDraftOrdersTheUniforms) {
  double next = 0.0;
  std::vector<RowPick> picks;
  SampleSettings base;
  base.temperature = 0.7f;
  base.top_k = 5;
  PlanSampledDraft(
      V{4, 9},
      [&] {
        SampleSettings t = base;
        t.u = next;
        next += 0.1;
        return t;
      },
      &picks);
  ASSERT_EQ(picks.size(), 3u);
  EXPECT_EQ(picks[0].draft, 4);
  EXPECT_DOUBLE_EQ(picks[0].u_accept, 0.0);
  EXPECT_DOUBLE_EQ(picks[0].sample.u, 0.1);
  EXPECT_EQ(picks[1].draft, 9);
  EXPECT_DOUBLE_EQ(picks[1].u_accept, 0.2);
  EXPECT_DOUBLE_EQ(picks[1].sample.u, 0.30000000000000004);
  EXPECT_EQ(picks[2].draft, -1);
  EXPECT_DOUBLE_EQ(picks[2].sample.u, 0.4);
  for (const RowPick& p : picks) {
    EXPECT_EQ(p.mode, PickMode::kDevice);
    EXPECT_EQ(p.sample.top_k, 5);
    EXPECT_FLOAT_EQ(p.sample.temperature, 0.7f);
  }
}

TEST(DraftVerifyTest, VerifyDraftRowAcceptsExactlyBelowTheDraftsProbability) {
  // Weights 1, e^-1, e^-2 at T = 1: p(1) = e^-1 / (1 + e^-1 + e^-2).
  const std::vector<float> row = {2.0f, 1.0f, 0.0f};
  const double p1 = std::exp(-1.0) / (1.0 + std::exp(-1.0) + std::exp(-2.0));
  SampleSettings s;
  for (double u : {0.0, p1 * 0.999, p1 * 1.001, 0.9}) {
    std::vector<float> r = row;
    s.u = 0.5;
    const int32_t t = VerifyDraftRow(r, s, 1, u);
    if (u < p1) {
      EXPECT_EQ(t, 1) << u;
    } else {
      EXPECT_NE(t, 1) << u;  // the residual never holds the draft token
    }
  }
  // Outside the vocabulary: never accepted, the row drawn as usual.
  std::vector<float> r = row;
  s.u = 0.0;
  EXPECT_EQ(VerifyDraftRow(r, s, 7, 0.0), 0);
  // Only the draft token kept (top_k 1): accepted whatever the uniform.
  s.top_k = 1;
  r = row;
  EXPECT_EQ(VerifyDraftRow(r, s, 0, 0.999999), 0);
}

// The chi-square quantile for `df` degrees of freedom at 1 - 1e-3 (z =
// 3.0902), by Wilson and Hilferty's approximation, a little above the exact
// value for small df (14.13 for 13.82 at df 2, 18.72 for 18.47 at df 4).
double ChiSquare999(int df) {
  const double k = 2.0 / (9.0 * df);
  const double c = 1.0 - k + 3.0902 * std::sqrt(k);
  return df * c * c * c;
}

// Pearson's statistic of `count` (n draws) against `p`, over the tokens p
// gives mass; a token p gives none must never be drawn.
double PearsonChiSquare(const std::vector<double>& count, const std::vector<double>& p, double n,
                        int* df) {
  double chi = 0.0;
  *df = -1;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] <= 0.0) {
      EXPECT_EQ(count[t], 0.0) << "token " << t << " has no probability";
      continue;
    }
    ++*df;
    const double e = n * p[t];
    chi += (count[t] - e) * (count[t] - e) / e;
  }
  return chi;
}

// Every emitted position j (given drafts 0..j-1 accepted) is distributed as
// p_j, the row's own distribution, whichever draft tokens were proposed:
// Pearson's chi-square of each position's counts against p_j stays below
// the 99.9% quantile. The uniforms are a fixed-seed stream, so the
// statistics are the same on every run (printed). Rows: temperature 0.9,
// top_p 0.9 and min_p 0.05 (a truncated p; tokens outside it must never
// appear), drafts of three: a likely token, an unlikely one, one the
// truncation drops.
TEST(DraftVerifyTest, ChiSquareOfEveryPositionAgainstItsRowsDistribution) {
  const int32_t vocab = 8;
  const std::vector<std::vector<float>> rows = {
      {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.0f, 0.9f},
      {0.2f, 0.1f, 3.0f, 2.9f, 0.0f, 1.0f, 2.2f, -2.0f},
      {2.0f, 1.0f, 0.5f, 0.0f, 1.5f, 0.0f, -3.0f, 1.9f},
      {0.5f, 0.4f, 0.3f, 0.2f, 0.1f, 0.0f, -0.1f, 2.0f},
  };
  SampleSettings s;
  s.temperature = 0.9f;
  s.top_p = 0.9f;
  s.min_p = 0.05f;
  // Each row's distribution, as SampleWeights defines it.
  std::vector<std::vector<double>> p;
  for (const std::vector<float>& row : rows) {
    std::vector<float> w = row;
    EXPECT_EQ(SampleWeights(w, s), -1);
    double m = 0;
    for (float x : w) m += x;
    std::vector<double> q;
    for (float x : w) q.push_back(x / m);
    p.push_back(q);
  }
  for (const V& draft : {V{1, 2, 0}, V{4, 3, 7}, V{3, 6, 4}}) {
    Lcg rng;
    const int trials = 200000;
    std::vector<std::vector<double>> count(4, std::vector<double>(vocab, 0.0));
    std::vector<double> reached(4, 0.0);
    std::vector<float> buf;
    for (int i = 0; i < trials; ++i) {
      buf.clear();
      for (const std::vector<float>& row : rows) buf.insert(buf.end(), row.begin(), row.end());
      const DraftVerdict v = VerifySampledDraft(draft, buf, vocab, s, [&] { return rng(); });
      for (int j = 0; j <= v.accepted; ++j) {
        const int32_t t = j < v.accepted ? draft[static_cast<size_t>(j)] : v.next;
        count[static_cast<size_t>(j)][static_cast<size_t>(t)] += 1;
        reached[static_cast<size_t>(j)] += 1;
      }
    }
    for (size_t j = 0; j < 4; ++j) {
      if (reached[j] < 2000) continue;  // too few to judge (an unlikely draft before it)
      int df = 0;
      const double chi = PearsonChiSquare(count[j], p[j], reached[j], &df);
      ASSERT_GE(df, 1);
      std::printf(
          "draft {%d,%d,%d} position %zu: %.0f draws, chi-square %.2f (df %d, bound %.2f)\n",
          draft[0], draft[1], draft[2], j, reached[j], chi, df, ChiSquare999(df));
      EXPECT_LT(chi, ChiSquare999(df)) << "position " << j;
    }
    if (draft[0] == 1) {  // likely tokens: every position, the bonus row's too, is judged
      for (size_t j = 0; j < 4; ++j) EXPECT_GE(reached[j], 2000) << "position " << j;
    }
  }
}

}  // namespace
}  // namespace agentkv::engine
