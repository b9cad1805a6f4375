// AttendRows (tiled, online softmax, vector exp) against AttendOne, the
// one-query reference, on random inputs with NaN-poisoned outputs. Tolerance:
// 2e-5 relative to the output's scale (the vector exp is within 2e-7; the
// rest is summation order).
#include "engine/backend/cpu/cpu_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/cpu/cpu_kernels.h"

namespace agentkv::backend::cpu::kernels {
namespace {

TEST(CpuAttentionTest, Exp8MatchesStdExp) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-86.f, 80.f);
  for (int i = 0; i < 20000; ++i) {
    alignas(32) float x[8], y[8];
    for (float& v : x) v = i < 10000 ? u(rng) : u(rng) / 40.f;
    _mm256_store_ps(y, Exp8(_mm256_load_ps(x)));
    for (int k = 0; k < 8; ++k) {
      const double ref = std::exp(static_cast<double>(x[k]));
      ASSERT_NEAR(y[k], ref, 4e-7 * ref) << x[k];
    }
  }
  alignas(32) float x[8] = {-INFINITY, -1000.f, -88.f, 0.f, 1.f, -0.5f, 2.f, -3.f}, y[8];
  _mm256_store_ps(y, Exp8(_mm256_load_ps(x)));
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_FLOAT_EQ(y[3], 1.f);
}

struct Case {
  int head_dim, tokens, heads, window;
  float softcap;
  float sink = -INFINITY;  // finite: head h's sink is sink + h / 2
};

class AttendRowsTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttendRowsTest, MatchesAttendOne) {
  const Case c = GetParam();
  const int D = c.head_dim;
  std::mt19937 rng(c.tokens * 31 + D);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int keys = c.tokens + 40;  // 40 cached positions before the run
  std::vector<float> k(static_cast<size_t>(keys) * D), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  const int nrows = c.tokens * c.heads;
  std::vector<float> q(static_cast<size_t>(nrows) * D);
  for (float& x : q) x = 2.f * nd(rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(q.size(), nan), ref(q.size(), nan);
  std::vector<AttnRow> rows(nrows);
  for (int t = 0; t < c.tokens; ++t) {
    for (int h = 0; h < c.heads; ++h) {
      const int r = t * c.heads + h;
      const int32_t pos = 40 + t;
      const int32_t lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
      rows[r] =
          AttnRow{q.data() + static_cast<size_t>(r) * D, out.data() + static_cast<size_t>(r) * D,
                  pos, lo, c.sink > -INFINITY ? c.sink + 0.5f * h : -INFINITY};
    }
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> scratch(AttendRowsScratch(nrows, D), nan);
  auto key = [&](int32_t p) { return k.data() + static_cast<size_t>(p) * D; };
  auto val = [&](int32_t p) { return v.data() + static_cast<size_t>(p) * D; };
  AttendRows(rows.data(), nrows, D, scale, c.softcap, key, val, scratch.data());
  std::vector<float> scores(keys);
  for (const AttnRow& r : rows) {
    const size_t off = static_cast<size_t>(r.out - out.data());
    AttendOne(
        r.q, r.pos - r.lo + 1, D, scale, c.softcap, [&](int j) { return key(r.lo + j); },
        [&](int j) { return val(r.lo + j); }, scores.data(), ref.data() + off, r.sink);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << i;
    ASSERT_NEAR(out[i], ref[i], 2e-5f * (1.f + std::abs(ref[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttendRowsTest,
                         ::testing::Values(Case{32, 1, 1, 0, 0.f}, Case{32, 16, 3, 0, 0.f},
                                           Case{64, 7, 4, 0, 0.f}, Case{128, 16, 2, 0, 0.f},
                                           Case{32, 16, 2, 20, 0.f}, Case{64, 5, 8, 9, 0.f},
                                           Case{32, 12, 2, 0, 30.f}, Case{16, 3, 1, 1, 0.f},
                                           Case{64, 16, 4, 0, 0.f, 0.5f},
                                           Case{64, 9, 8, 5, 0.f, -2.f},
                                           Case{32, 3, 2, 1, 0.f, 12.f}));

// The sink by hand: scores 2 and 0 (values all 1s and all 2s) and a sink
// logit of 1: p = (e^2, e^0) / (e^2 + e^0 + e^1).
TEST(AttendOneTest, SinkJoinsTheDenominatorWithoutAValue) {
  const int D = 8;
  std::vector<float> q(D, 0.f), k0(D, 0.f), k1(D, 0.f), v0(D, 1.f), v1(D, 2.f), out(D);
  q[0] = 2.f;
  k0[0] = 1.f;
  std::vector<float> scores(2);
  auto key = [&](int j) { return j == 0 ? k0.data() : k1.data(); };
  auto val = [&](int j) { return j == 0 ? v0.data() : v1.data(); };
  const double den = std::exp(2.0) + 1.0 + std::exp(1.0);
  const double want = (std::exp(2.0) * 1 + 1.0 * 2) / den;
  // The scale (0.5 here) applies to the scores, not to the sink.
  AttendOne(q.data(), 2, D, 1.f, 0.f, key, val, scores.data(), out.data(), 1.f);
  for (float x : out) EXPECT_NEAR(x, want, 1e-6);
  q[0] = 4.f;
  AttendOne(q.data(), 2, D, 0.5f, 0.f, key, val, scores.data(), out.data(), 1.f);
  for (float x : out) EXPECT_NEAR(x, want, 1e-6);
  // Without a sink the weights sum to one.
  AttendOne(q.data(), 2, D, 0.5f, 0.f, key, val, scores.data(), out.data());
  for (float x : out) EXPECT_NEAR(x, (std::exp(2.0) + 2) / (std::exp(2.0) + 1), 1e-6);
  // A dominant sink takes almost all the weight, and the output shrinks.
  AttendOne(q.data(), 2, D, 0.5f, 0.f, key, val, scores.data(), out.data(), 30.f);
  for (float x : out) EXPECT_LT(std::abs(x), 1e-9);
  // AttendRows agrees, including a sink far above every score.
  for (float sink : {1.f, 30.f, -50.f}) {
    std::vector<float> rows_out(D), scratch(AttendRowsScratch(1, D));
    AttnRow row{q.data(), rows_out.data(), 1, 0, sink};
    AttendRows(&row, 1, D, 0.5f, 0.f, key, val, scratch.data());
    AttendOne(q.data(), 2, D, 0.5f, 0.f, key, val, scores.data(), out.data(), sink);
    for (int d = 0; d < D; ++d) EXPECT_NEAR(rows_out[d], out[d], 1e-6 + 1e-5 * std::abs(out[d]));
  }
}

}  // namespace
}  // namespace agentkv::backend::cpu::kernels
