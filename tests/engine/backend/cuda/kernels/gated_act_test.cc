// The gated products every CUDA gated activation computes (gated_act.h) on
// the host: no GPU and no CUDA toolkit needed. Against the CPU backend's
// references on the same fp32 inputs: GatedActivation (SiLU and GELU with
// the tanh approximation, the dense MLP) and ClampedSwiglu (GPT-OSS's
// experts), over values from deep negative to past the clamp, the same
// float operations in the same order, so within a few ulps.
#include "engine/backend/cuda/kernels/gated_act.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/backend/cpu/cpu_kernels.h"
#include "engine/backend/cpu/cpu_moe.h"

namespace agentkv::backend::cuda::kernels {
namespace {

// n gate values then n up values (the CPU references' [gate | up] rows):
// a sweep of -12..12 plus random ones, and exact zeros.
std::vector<float> GateUp(int n) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> v(2 * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    v[i] = i < n / 2 ? -12.f + 24.f * static_cast<float>(i) / static_cast<float>(n / 2) : nd(rng);
    v[n + i] = nd(rng);
  }
  v[0] = 0.f;
  v[n + 1] = 0.f;
  return v;
}

void ExpectForm(GatedForm form, const std::vector<float>& want, const std::vector<float>& gu, int n,
                float limit) {
  for (int i = 0; i < n; ++i) {
    const float got = GatedProduct(gu[i], gu[n + i], form, limit);
    EXPECT_FLOAT_EQ(got, want[i]) << "form " << static_cast<int>(form) << " gate " << gu[i]
                                  << " up " << gu[n + i];
  }
}

TEST(GatedAct, FormsMatchTheCpuReferences) {
  const int n = 1000;
  const std::vector<float> gu = GateUp(n);
  std::vector<float> want(n);
  cpu::kernels::GatedActivation(gu.data(), want.data(), 1, n, model::Activation::kSilu);
  ExpectForm(GatedForm::kSwiglu, want, gu, n, 0.f);
  cpu::kernels::GatedActivation(gu.data(), want.data(), 1, n, model::Activation::kGeluTanh);
  ExpectForm(GatedForm::kGeluTanh, want, gu, n, 0.f);
  cpu::kernels::ClampedSwiglu(gu.data(), want.data(), 1, n, 7.f);
  ExpectForm(GatedForm::kClampedSwiglu, want, gu, n, 7.f);
}

// GELU (tanh form) at points whose values are known: 0, odd symmetry
// gelu(x) - gelu(-x) = x, about x for large x and about 0 for very
// negative x; and it differs from SiLU (a swapped form would show).
TEST(GatedAct, GeluTanhIsGelu) {
  EXPECT_EQ(GeluTanh(0.f), 0.f);
  for (float x : {0.1f, 0.5f, 1.f, 2.f, 3.f})
    EXPECT_NEAR(GeluTanh(x) - GeluTanh(-x), x, 1e-6f * (1 + x)) << x;
  EXPECT_NEAR(GeluTanh(10.f), 10.f, 1e-5f);
  EXPECT_NEAR(GeluTanh(-10.f), 0.f, 1e-5f);
  // gelu(1) = 0.8412 (tanh form 0.84119), silu(1) = 0.7311.
  EXPECT_NEAR(GatedProduct(1.f, 2.f, GatedForm::kGeluTanh, 0.f), 2 * 0.841192f, 1e-5f);
  EXPECT_NEAR(GatedProduct(1.f, 2.f, GatedForm::kSwiglu, 0.f), 2 * 0.731059f, 1e-5f);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels
