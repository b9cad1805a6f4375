// ComputeRowLogprobs, the CPU reference of the backends' logprobs: against
// a sort-based computation written here, against the engine's Sampler (the
// values the API returns today), and on the edge rows (ties, NaN, -inf).
#include "engine/backend/row_logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/sampler.h"

namespace agentkv::backend {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(RowLogprobsTest, MatchesASortedLogSoftmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int vocab : {1, 7, 1000}) {
    for (double scale : {1.0, 1 / 0.3, 1 / 1.7}) {
      std::vector<float> l(static_cast<size_t>(vocab));
      for (float& x : l) x = std::round(nd(rng) * 4.f) / 4.f;  // ties
      const int want = std::min(vocab, 20);
      const RowLogprobs r = ComputeRowLogprobs(l.data(), vocab, scale, want, vocab - 1);
      long double z = 0;
      for (float x : l) z += std::exp(static_cast<long double>(x) * scale);
      const double lse = static_cast<double>(std::log(z));
      std::vector<int> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      ASSERT_EQ(r.count, want);
      EXPECT_NEAR(r.lse, lse, 1e-9 * std::max(1.0, std::abs(lse)));
      for (int k = 0; k < want; ++k) {
        EXPECT_EQ(r.ids[k], order[static_cast<size_t>(k)]) << "vocab " << vocab << " k " << k;
        EXPECT_NEAR(r.logprobs[k], l[order[static_cast<size_t>(k)]] * scale - lse, 1e-5);
      }
      EXPECT_NEAR(r.chosen, l[static_cast<size_t>(vocab - 1)] * scale - lse, 1e-5);
    }
  }
}

// The Sampler's logprobs (what the API returns for host rows) and the
// reference agree, so a row moved to the backend answers the same.
TEST(RowLogprobsTest, AgreesWithTheSampler) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int vocab = 5000;
  for (float t : {0.0f, 0.6f, 1.3f}) {
    engine::SamplingParams p;
    p.temperature = t;
    p.seed = 4;
    p.logprobs = 20;
    engine::Sampler s(p, vocab);
    std::vector<float> l(vocab);
    for (float& x : l) x = nd(rng);
    std::vector<float> row = l;
    const engine::SampledToken tok = s.Sample(row);
    const RowLogprobs r = ComputeRowLogprobs(l.data(), vocab, t > 0 ? 1.0 / t : 1.0, 20, tok.token);
    ASSERT_EQ(r.count, static_cast<int32_t>(tok.top_logprobs.size()));
    for (int k = 0; k < r.count; ++k) {
      EXPECT_EQ(r.ids[k], tok.top_logprobs[k].token);
      EXPECT_NEAR(r.logprobs[k], tok.top_logprobs[k].logprob, 1e-5);
    }
    EXPECT_NEAR(r.chosen, *tok.logprob, 1e-5);
  }
}

TEST(RowLogprobsTest, EdgeRows) {
  // NaN neither enters the sum nor the top; -inf enters with logprob -inf.
  const std::vector<float> a = {kNan, 1.0f, -kInf, 1.0f, kNan};
  RowLogprobs r = ComputeRowLogprobs(a.data(), 5, 1.0, 4, 2);
  ASSERT_EQ(r.count, 3);
  EXPECT_EQ(r.ids[0], 1);
  EXPECT_EQ(r.ids[1], 3);
  EXPECT_EQ(r.ids[2], 2);
  EXPECT_NEAR(r.logprobs[0], std::log(0.5), 1e-6);
  EXPECT_EQ(r.logprobs[2], -kInf);
  EXPECT_EQ(r.chosen, -kInf);
  // A NaN chosen token has no probability: -inf, never NaN.
  EXPECT_EQ(ComputeRowLogprobs(a.data(), 5, 1.0, 4, 0).chosen, -kInf);
  // Every logit -inf: lse 0, logprobs -inf, no NaN.
  const std::vector<float> b = {-kInf, -kInf};
  r = ComputeRowLogprobs(b.data(), 2, 1.0, 2, 0);
  EXPECT_EQ(r.lse, 0.0);
  EXPECT_EQ(r.count, 2);
  EXPECT_EQ(r.ids[0], 0);
  EXPECT_EQ(r.chosen, -kInf);
  // want 0: no entries, the chosen token's value still; out-of-range chosen
  // and want are clamped / ignored.
  const std::vector<float> c = {0.f, 0.f};
  r = ComputeRowLogprobs(c.data(), 2, 1.0, 0, 1);
  EXPECT_EQ(r.count, 0);
  EXPECT_NEAR(r.chosen, std::log(0.5), 1e-6);
  r = ComputeRowLogprobs(c.data(), 2, 1.0, 50, 7);
  EXPECT_EQ(r.count, 2);
  EXPECT_EQ(r.chosen, 0.0f);
}

}  // namespace
}  // namespace agentkv::backend
