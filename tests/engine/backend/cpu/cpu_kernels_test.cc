// The weight-streaming Linear kernels against a plain double-precision
// reference, on random inputs with poisoned outputs.
#include "engine/backend/cpu/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "util/bf16.h"

namespace agentkv::backend::cpu {
namespace {

void Reference(const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& bias, std::vector<double>& y, int64_t m, int64_t n,
               int64_t k) {
  y.assign(m * n, 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double s = bias.empty() ? 0.0 : bias[c];
      for (int64_t i = 0; i < k; ++i) s += static_cast<double>(x[r * k + i]) * w[c * k + i];
      y[r * n + c] = s;
    }
}

// Tolerance: fp32 accumulation over k terms of magnitude <= 1: k * 2^-23 in
// the worst case; we allow 1e-5 relative to the sum of |terms|.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t n,
                 int64_t k) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double mag = 0;
      for (int64_t i = 0; i < k; ++i) mag += std::fabs(x[r * k + i] * w[c * k + i]);
      ASSERT_NEAR(got[r * n + c], want[r * n + c], 1e-5 * (mag + 1)) << r << "," << c;
    }
}

class LinearTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(LinearTest, MatchesReference) {
  const auto [m, n, k] = GetParam();
  std::mt19937 rng(m * 1000 + n * 10 + k);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(m * k), w(n * k), bias(n);
  for (auto& v : x) v = u(rng);
  for (auto& v : w) v = Bf16ToF32(F32ToBf16(u(rng)));  // exactly representable in bf16
  for (auto& v : bias) v = u(rng);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = F32ToBf16(w[i]);
  std::vector<double> want;
  ThreadPool pool(3);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> y(m * n, std::numeric_limits<float>::quiet_NaN());
    kernels::Linear(x.data(), w.data(), bias.data(), y.data(), m, n, k, p);
    Reference(x, w, bias, want, m, n, k);
    ExpectClose(y, want, x, w, m, n, k);
    std::vector<float> y16(m * n, std::numeric_limits<float>::quiet_NaN());
    kernels::LinearBf16(x.data(), w16.data(), y16.data(), m, n, k, p);
    Reference(x, w, {}, want, m, n, k);
    ExpectClose(y16, want, x, w, m, n, k);
  }
}

// Small m (streaming path, with remainders in k and in rows of 8) and large
// m (sgemm path).
INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(std::tuple{1, 1, 1}, std::tuple{1, 200, 64},
                                           std::tuple{3, 131, 37}, std::tuple{8, 64, 256},
                                           std::tuple{13, 257, 100}, std::tuple{16, 70, 8},
                                           std::tuple{40, 33, 129}));

// YaRN's attention factor multiplies cos and sin: the rotation by hand, for
// pairs (i, i + 2) of a head of 4, every output times the factor.
TEST(ApplyRopeTest, ScaleMultipliesCosAndSin) {
  const float inv_freq[2] = {1.0f, 0.25f};
  for (float scale : {1.0f, 1.3466f}) {
    float x[4] = {1.f, 2.f, 3.f, -1.f};
    kernels::ApplyRope(x, 1, 4, 3, inv_freq, scale);
    const double a0 = 3 * 1.0, a1 = 3 * 0.25;
    EXPECT_NEAR(x[0], scale * (1 * std::cos(a0) - 3 * std::sin(a0)), 1e-5);
    EXPECT_NEAR(x[1], scale * (2 * std::cos(a1) - -1 * std::sin(a1)), 1e-5);
    EXPECT_NEAR(x[2], scale * (3 * std::cos(a0) + 1 * std::sin(a0)), 1e-5);
    EXPECT_NEAR(x[3], scale * (-1 * std::cos(a1) + 2 * std::sin(a1)), 1e-5);
  }
}

}  // namespace
}  // namespace agentkv::backend::cpu
