// SampleDraw (the CPU reference of the draw a backend makes on its device)
// on constructed logits, where the kept set and the inverse-CDF pick can be
// worked out by hand.
#include "engine/backend/sample_draw.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace agentkv::backend {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

SampleSettings Settings(float t, int32_t top_k, float top_p, float min_p, double u) {
  SampleSettings s;
  s.temperature = t;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  s.u = u;
  return s;
}

int32_t Draw(std::vector<float> logits, const SampleSettings& s) { return SampleDraw(logits, s); }

// Every token the draw can give, u swept over [0, 1).
std::vector<int32_t> Reachable(const std::vector<float>& logits, SampleSettings s) {
  std::vector<int32_t> seen(logits.size(), 0);
  for (int i = 0; i < 1000; ++i) {
    s.u = i / 1000.0;
    seen[static_cast<size_t>(Draw(logits, s))] = 1;
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < seen.size(); ++i)
    if (seen[i]) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

TEST(SampleDrawTest, InverseCdfInIdOrder) {
  const std::vector<float> equal(4, 0.0f);  // weights 1, 1, 1, 1; M = 4
  EXPECT_EQ(Draw(equal, Settings(1, 0, 1, 0, 0.0)), 0);
  EXPECT_EQ(Draw(equal, Settings(1, 0, 1, 0, 0.2499)), 0);
  EXPECT_EQ(Draw(equal, Settings(1, 0, 1, 0, 0.25)), 1);  // running sum 1 is not > 1
  EXPECT_EQ(Draw(equal, Settings(1, 0, 1, 0, 0.3)), 1);
  EXPECT_EQ(Draw(equal, Settings(1, 0, 1, 0, 0.75)), 3);
  EXPECT_EQ(Draw(equal, Settings(1, 0, 1, 0, std::nextafter(1.0, 0.0))), 3);
  // Weights 1 and e^-1 at T = 2 for logits 0, -2: token 0 below 1 / (1 + e^-1).
  const double split = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_EQ(Draw({0.0f, -2.0f}, Settings(2, 0, 1, 0, split - 1e-4)), 0);
  EXPECT_EQ(Draw({0.0f, -2.0f}, Settings(2, 0, 1, 0, split + 1e-4)), 1);
  // Ids order the draw, not weights: the heavy token last.
  EXPECT_EQ(Draw({-1.0f, -1.0f, 5.0f}, Settings(1, 0, 1, 0, 0.0)), 0);
  EXPECT_EQ(Draw({-1.0f, -1.0f, 5.0f}, Settings(1, 0, 1, 0, 0.5)), 2);
}

TEST(SampleDrawTest, TopKTiesKeepTheLowestIds) {
  // Weights 1 at ids 1, 2, 3 (tied best), e^-3 at 0 and 4; k = 2 keeps ids
  // 1 and 2, each half of the kept mass.
  const std::vector<float> l = {0.0f, 3.0f, 3.0f, 3.0f, 0.0f};
  EXPECT_EQ(Reachable(l, Settings(1, 2, 1, 0, 0)), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(Draw(l, Settings(1, 2, 1, 0, 0.4999)), 1);
  EXPECT_EQ(Draw(l, Settings(1, 2, 1, 0, 0.5)), 2);
  // k = 4: all three tied plus the lower-id of the two e^-3 tokens.
  EXPECT_EQ(Reachable(l, Settings(1, 4, 1, 0, 0)), (std::vector<int32_t>{0, 1, 2, 3}));
  // k at or beyond the vocabulary is off.
  EXPECT_EQ(Reachable(l, Settings(1, 5, 1, 0, 0)), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(Reachable(l, Settings(1, 1000, 1, 0, 0)), (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(SampleDrawTest, TopPKeepsTheShortestPrefixReachingTheTarget) {
  // Weights 1, e^-1, e^-2, e^-3 (total 1.553).
  const std::vector<float> l = {0.0f, -1.0f, -2.0f, -3.0f};
  EXPECT_EQ(Reachable(l, Settings(1, 0, 0.6f, 0, 0)), (std::vector<int32_t>{0}));  // 0.93 <= 1
  EXPECT_EQ(Reachable(l, Settings(1, 0, 0.7f, 0, 0)), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Reachable(l, Settings(1, 0, 0.95f, 0, 0)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Reachable(l, Settings(1, 0, 0.99f, 0, 0)), (std::vector<int32_t>{0, 1, 2, 3}));
  // A target met exactly by a prefix keeps that prefix and nothing more:
  // four equal weights, top_p 0.5 -> 2 of 4, the lower ids.
  const std::vector<float> eq(4, 1.5f);
  EXPECT_EQ(Reachable(eq, Settings(1, 0, 0.5f, 0, 0)), (std::vector<int32_t>{0, 1}));
  // Ties straddling the boundary: weights 1 (id 3), then e^-1 at ids 0, 1,
  // 2; top_p of (1 + 1.5 e^-1) / (1 + 3 e^-1) needs two of the three ties.
  const std::vector<float> st = {-1.0f, -1.0f, -1.0f, 0.0f};
  const float p = static_cast<float>((1 + 1.5 * std::exp(-1.0)) / (1 + 3 * std::exp(-1.0)));
  EXPECT_EQ(Reachable(st, Settings(1, 0, p, 0, 0)), (std::vector<int32_t>{0, 1, 3}));
  // top_p applies to the top_k set's mass: k = 2 keeps ids 3 and 0 (mass
  // 1 + e^-1); 0.8 of it needs both.
  EXPECT_EQ(Reachable(st, Settings(1, 2, 0.8f, 0, 0)), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(Reachable(st, Settings(1, 2, 0.7f, 0, 0)), (std::vector<int32_t>{3}));
}

TEST(SampleDrawTest, MinPIsRelativeToTheBestAndAppliesLast) {
  const std::vector<float> l = {0.0f, -1.0f, -2.0f, -3.0f};  // 1, .368, .135, .050
  EXPECT_EQ(Reachable(l, Settings(1, 0, 1, 0.2f, 0)), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(Reachable(l, Settings(1, 0, 1, 0.1f, 0)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(Reachable(l, Settings(1, 0, 1, 1.0f, 0)), (std::vector<int32_t>{0}));
  // The draw renormalizes over what min_p kept: 1 / (1 + e^-1).
  const double split = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_EQ(Draw(l, Settings(1, 0, 1, 0.2f, split - 1e-4)), 0);
  EXPECT_EQ(Draw(l, Settings(1, 0, 1, 0.2f, split + 1e-4)), 1);
  // After top_p (which saw every weight): top_p 0.99 keeps all four, min_p
  // then drops two.
  EXPECT_EQ(Reachable(l, Settings(1, 0, 0.99f, 0.2f, 0)), (std::vector<int32_t>{0, 1}));
}

TEST(SampleDrawTest, TemperatureExtremes) {
  const std::vector<float> l = {1.0f, 1.01f, 0.5f, 1.01f};
  // T -> 0: only the best tokens keep weight; ties split by id order.
  EXPECT_EQ(Reachable(l, Settings(1e-30f, 0, 1, 0, 0)), (std::vector<int32_t>{1, 3}));
  // 1 / T overflowing leaves nothing kept: the argmax.
  EXPECT_EQ(Reachable(l, Settings(1e-45f, 0, 1, 0, 0)), (std::vector<int32_t>{1}));
  // T = 2 (the largest valid): every token reachable.
  EXPECT_EQ(Reachable(l, Settings(2.0f, 0, 1, 0, 0)), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(SampleDrawTest, NonFiniteRowsFallBackToTheArgmax) {
  for (double u : {0.0, 0.5, 0.999}) {
    EXPECT_EQ(Draw({-kInf, -kInf, -kInf}, Settings(1, 0, 1, 0, u)), 0);
    EXPECT_EQ(Draw({kNan, kNan}, Settings(1, 0, 1, 0, u)), 0);
    EXPECT_EQ(Draw({kNan, -kInf, kNan}, Settings(1, 0, 1, 0, u)), 0);
    EXPECT_EQ(Draw({kNan, 2.0f, kInf, kInf}, Settings(1, 5, 0.5f, 0.1f, u)), 2);
  }
  // NaN and -inf tokens in a finite row are never drawn.
  const std::vector<float> l = {kNan, 1.0f, -kInf, 1.0f, kNan};
  EXPECT_EQ(Reachable(l, Settings(1, 0, 1, 0, 0)), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(Reachable(l, Settings(1, 3, 0.99f, 0, 0)), (std::vector<int32_t>{1, 3}));
}

// SampleWeights and DrawFromWeights split SampleDraw (speculative
// verification needs the distribution itself).
TEST(SampleDrawTest, WeightsThenDrawIsSampleDraw) {
  const std::vector<float> row = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f};
  SampleSettings s;
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  for (double u : {0.0, 0.2, 0.5, 0.77, 0.999}) {
    s.u = u;
    std::vector<float> a = row, b = row;
    ASSERT_EQ(SampleWeights(b, s), -1);
    EXPECT_EQ(SampleDraw(a, s), DrawFromWeights(b, u)) << u;
  }
  std::vector<float> zero = {0.0f, 0.0f};
  EXPECT_EQ(DrawFromWeights(zero, 0.5), -1);
}

}  // namespace
}  // namespace agentkv::backend
