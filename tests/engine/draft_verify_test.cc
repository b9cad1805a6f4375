// Verifying speculative drafts: greedy acceptance and rejection sampling
// that keeps the target distribution.
#include "engine/draft_verify.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/backend/sample_draw.h"

namespace agentkv::engine {
namespace {

using V = std::vector<int32_t>;

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
  backend::SampleSettings s;
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
  backend::SampleSettings s;
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
  backend::SampleSettings s;
  Lcg rng;
  DraftVerdict v = VerifySampledDraft(V{0}, rows, 3, s, [&] { return rng(); });
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 1);
  rows = {0.0f, INFINITY, 0.0f, 1.0f, 2.0f, 3.0f};
  v = VerifySampledDraft(V{1}, rows, 3, s, [&] { return rng(); });
  EXPECT_EQ(v.accepted, 1);
}

}  // namespace
}  // namespace agentkv::engine
