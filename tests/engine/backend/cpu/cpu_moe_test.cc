// The mixture-of-experts pieces against hand-computed values and against a
// naive reference written straight from the Hugging Face tensor layouts
// (GPT-OSS's interleaved [E, H, 2I] and [E, I, H]; Qwen3-MoE's per-expert
// [out, in] matrices), so that the de-interleaving and transposition at load
// are checked too.
#include "engine/backend/cpu/cpu_moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../../test_model.h"

namespace agentkv::backend::cpu {
namespace {

using testing::MapWeights;
using testing::RandomWeights;
using testing::SmallConfig;

TEST(RouteTopKTest, TopKThenSoftmaxWithTies) {
  const float logits[5] = {1.f, 3.f, 2.f, 3.f, 0.f};
  int32_t ex[3];
  float wt[3];
  kernels::RouteTopK(logits, 5, 2, model::MoeRouting::kTopKThenSoftmax, false, ex, wt);
  EXPECT_EQ(ex[0], 1);  // the tie 3 / 3 goes to the lower id first
  EXPECT_EQ(ex[1], 3);
  EXPECT_FLOAT_EQ(wt[0], 0.5f);
  EXPECT_FLOAT_EQ(wt[1], 0.5f);
  kernels::RouteTopK(logits, 5, 3, model::MoeRouting::kTopKThenSoftmax, false, ex, wt);
  EXPECT_EQ(ex[2], 2);
  const double den = 2 + std::exp(-1.0);
  EXPECT_NEAR(wt[0], 1 / den, 1e-7);
  EXPECT_NEAR(wt[1], 1 / den, 1e-7);
  EXPECT_NEAR(wt[2], std::exp(-1.0) / den, 1e-7);
  // Equal logits everywhere: ids 0..k-1, uniform weights.
  const float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  kernels::RouteTopK(flat, 4, 3, model::MoeRouting::kTopKThenSoftmax, false, ex, wt);
  EXPECT_EQ(ex[0], 0);
  EXPECT_EQ(ex[1], 1);
  EXPECT_EQ(ex[2], 2);
  for (float w : wt) EXPECT_NEAR(w, 1.f / 3, 1e-7);
}

TEST(RouteTopKTest, SoftmaxThenTopKWithAndWithoutRenormalising) {
  const float logits[4] = {0.f, 2.f, -1.f, 1.f};
  double den = 0;
  for (float l : logits) den += std::exp(l);
  int32_t ex[2];
  float wt[2];
  kernels::RouteTopK(logits, 4, 2, model::MoeRouting::kSoftmaxThenTopK, false, ex, wt);
  EXPECT_EQ(ex[0], 1);
  EXPECT_EQ(ex[1], 3);
  EXPECT_NEAR(wt[0], std::exp(2.0) / den, 1e-7);
  EXPECT_NEAR(wt[1], std::exp(1.0) / den, 1e-7);
  kernels::RouteTopK(logits, 4, 2, model::MoeRouting::kSoftmaxThenTopK, true, ex, wt);
  EXPECT_NEAR(wt[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-7);
  EXPECT_NEAR(wt[1], std::exp(1.0) / (std::exp(2.0) + std::exp(1.0)), 1e-7);
  const float tie[3] = {1.f, 4.f, 4.f};
  kernels::RouteTopK(tie, 3, 1, model::MoeRouting::kSoftmaxThenTopK, false, ex, wt);
  EXPECT_EQ(ex[0], 1);
}

TEST(ClampedSwigluTest, HandComputed) {
  // Rows of [gate x3 | up x3].
  const float gu[6] = {10.f, -1.f, 0.5f, -9.f, 0.5f, 8.f};
  float out[3];
  kernels::ClampedSwiglu(gu, out, 1, 3, 7.f);
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  EXPECT_NEAR(out[0], (-7.0 + 1) * 7.0 * sig(1.702 * 7), 1e-5);   // gate and up clamped
  EXPECT_NEAR(out[1], (0.5 + 1) * -1.0 * sig(-1.702), 1e-6);      // gate only bounded above
  EXPECT_NEAR(out[2], (7.0 + 1) * 0.5 * sig(1.702 * 0.5), 1e-6);  // up clamped to 7
  const float neg[2] = {-30.f, 100.f};  // a very negative gate is not clamped
  kernels::ClampedSwiglu(neg, out, 1, 1, 7.f);
  EXPECT_NEAR(out[0], 8.0 * -30.0 * sig(-1.702 * 30), 1e-9);
}

// Naive GPT-OSS MLP for one token from the checkpoint's tensors.
std::vector<double> GptOssRef(const model::ModelConfig& c, const MapWeights& w, int layer,
                              const float* x) {
  const int E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  const int K = c.moe.experts_per_token;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  const auto& rw = w.t.at(p + "router.weight");
  const auto& rb = w.t.at(p + "router.bias");
  const auto& gu = w.t.at(p + "experts.gate_up_proj");
  const auto& gb = w.t.at(p + "experts.gate_up_proj_bias");
  const auto& dn = w.t.at(p + "experts.down_proj");
  const auto& db = w.t.at(p + "experts.down_proj_bias");
  std::vector<double> logit(E);
  for (int e = 0; e < E; ++e) {
    logit[e] = rb[e];
    for (int h = 0; h < H; ++h) logit[e] += double(rw[e * H + h]) * x[h];
  }
  std::vector<int> idx(E);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return logit[a] > logit[b]; });
  double den = 0;
  for (int j = 0; j < K; ++j) den += std::exp(logit[idx[j]] - logit[idx[0]]);
  std::vector<double> out(H, 0.0);
  for (int j = 0; j < K; ++j) {
    const int e = idx[j];
    const double weight = std::exp(logit[e] - logit[idx[0]]) / den;
    std::vector<double> act(I);
    for (int i = 0; i < I; ++i) {
      double g = gb[e * 2 * I + 2 * i], u = gb[e * 2 * I + 2 * i + 1];
      for (int h = 0; h < H; ++h) {
        g += double(x[h]) * gu[(size_t(e) * H + h) * 2 * I + 2 * i];
        u += double(x[h]) * gu[(size_t(e) * H + h) * 2 * I + 2 * i + 1];
      }
      g = std::min(g, 7.0);
      u = std::max(-7.0, std::min(u, 7.0));
      act[i] = (u + 1) * g / (1 + std::exp(-1.702 * g));
    }
    for (int h = 0; h < H; ++h) {
      double y = db[e * H + h];
      for (int i = 0; i < I; ++i) y += act[i] * dn[(size_t(e) * I + i) * H + h];
      out[h] += weight * y;
    }
  }
  return out;
}

// Naive Qwen3-MoE MLP for one token from the per-expert tensors.
std::vector<double> Qwen3MoeRef(const model::ModelConfig& c, const MapWeights& w, int layer,
                                const float* x) {
  const int E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  const int K = c.moe.experts_per_token;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  const auto& rw = w.t.at(p + "gate.weight");
  std::vector<double> prob(E);
  double mx = -1e300, den = 0;
  for (int e = 0; e < E; ++e) {
    prob[e] = 0;
    for (int h = 0; h < H; ++h) prob[e] += double(rw[e * H + h]) * x[h];
    mx = std::max(mx, prob[e]);
  }
  for (double& v : prob) den += v = std::exp(v - mx);
  for (double& v : prob) v /= den;
  std::vector<int> idx(E);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  double top = 0;
  for (int j = 0; j < K; ++j) top += prob[idx[j]];
  std::vector<double> out(H, 0.0);
  for (int j = 0; j < K; ++j) {
    const int e = idx[j];
    const std::string q = p + "experts." + std::to_string(e) + ".";
    const auto& g = w.t.at(q + "gate_proj.weight");
    const auto& u = w.t.at(q + "up_proj.weight");
    const auto& d = w.t.at(q + "down_proj.weight");
    std::vector<double> act(I);
    for (int i = 0; i < I; ++i) {
      double gv = 0, uv = 0;
      for (int h = 0; h < H; ++h) {
        gv += double(g[i * H + h]) * x[h];
        uv += double(u[i * H + h]) * x[h];
      }
      act[i] = gv / (1 + std::exp(-gv)) * uv;
    }
    const double weight = c.moe.norm_topk_prob ? prob[e] / top : prob[e];
    for (int h = 0; h < H; ++h) {
      double y = 0;
      for (int i = 0; i < I; ++i) y += act[i] * d[h * I + i];
      out[h] += weight * y;
    }
  }
  return out;
}

class CpuMoeTest : public ::testing::TestWithParam<model::Architecture> {};

TEST_P(CpuMoeTest, MatchesNaiveReferenceFromCheckpointLayout) {
  const model::ModelConfig c = SmallConfig(GetParam());
  const MapWeights w = RandomWeights(c, 5);
  const int H = c.hidden_size;
  MoeLayerWeights lw;
  ASSERT_TRUE(LoadMoeLayer(c, w, 2, &lw).ok());
  // 1 token (decode) and 37 (prefill: sgemm rather than the streaming kernel).
  for (int T : {1, 37}) {
    std::mt19937 rng(T);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(T) * H), out(x.size());
    for (float& v : x) v = nd(rng);
    ThreadPool pool(2);
    CpuMoe moe;
    moe.Forward(c, lw, x.data(), out.data(), T, &pool);
    for (int t = 0; t < T; ++t) {
      const auto ref = GetParam() == model::Architecture::kGptOss ? GptOssRef(c, w, 2, &x[t * H])
                                                                  : Qwen3MoeRef(c, w, 2, &x[t * H]);
      double num = 0, den = 0;
      for (int h = 0; h < H; ++h) {
        num += (out[t * H + h] - ref[h]) * (out[t * H + h] - ref[h]);
        den += ref[h] * ref[h];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-5) << "T " << T << " token " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CpuMoeTest,
                         ::testing::Values(model::Architecture::kGptOss,
                                           model::Architecture::kQwen3Moe));

TEST(CpuMoeLoadTest, Qwen3MoeFusedLayoutLoadsLikePerExpert) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3Moe);
  const MapWeights w = RandomWeights(c, 9);
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  MapWeights fused;
  fused.t["model.layers.0.mlp.gate.weight"] = w.t.at("model.layers.0.mlp.gate.weight");
  std::vector<float> gu, dn;
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    for (const char* n : {"gate_proj.weight", "up_proj.weight"}) {
      const auto& v = w.t.at(q + n);
      gu.insert(gu.end(), v.begin(), v.end());
    }
    const auto& d = w.t.at(q + "down_proj.weight");
    dn.insert(dn.end(), d.begin(), d.end());
  }
  ASSERT_EQ(static_cast<int64_t>(gu.size()), E * 2 * I * H);
  fused.t["model.layers.0.mlp.experts.gate_up_proj"] = gu;
  fused.t["model.layers.0.mlp.experts.down_proj"] = dn;
  MoeLayerWeights a, b;
  ASSERT_TRUE(LoadMoeLayer(c, w, 0, &a).ok());
  ASSERT_TRUE(LoadMoeLayer(c, fused, 0, &b).ok());
  EXPECT_EQ(a.gate_up, b.gate_up);
  EXPECT_EQ(a.down, b.down);
}

TEST(CpuMoeLoadTest, MissingOrMisshapenTensorsAreErrors) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kGptOss);
  MapWeights w = RandomWeights(c, 1);
  MoeLayerWeights lw;
  w.t.erase("model.layers.0.mlp.experts.down_proj_bias");
  Status st = LoadMoeLayer(c, w, 0, &lw);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("down_proj_bias"), std::string::npos) << st.ToString();
  w = RandomWeights(c, 1);
  w.t["model.layers.0.mlp.experts.gate_up_proj"].pop_back();
  EXPECT_FALSE(LoadMoeLayer(c, w, 0, &lw).ok());
  const model::ModelConfig q = SmallConfig(model::Architecture::kQwen3Moe);
  MapWeights wq = RandomWeights(q, 1);
  wq.t.erase("model.layers.0.mlp.experts.5.up_proj.weight");
  st = LoadMoeLayer(q, wq, 0, &lw);
  EXPECT_NE(st.ToString().find("experts.5.up_proj"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace agentkv::backend::cpu
