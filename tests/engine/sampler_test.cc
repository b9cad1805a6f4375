#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/sample_draw.h"

namespace agentkv::engine {
namespace {

// Reference softmax in double, written independently of the sampler.
std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp((logits[i] - m) / temperature);
  for (double& v : p) v /= z;
  return p;
}

std::vector<double> Frequencies(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<double> f(logits.size());
  std::vector<float> buf;
  for (int i = 0; i < draws; ++i) {
    buf = logits;
    f[static_cast<size_t>(s.Sample(buf).token)] += 1.0;
  }
  for (double& v : f) v /= draws;
  return f;
}

// Each frequency within 5 binomial standard deviations (plus a floor).
void ExpectMatches(const std::vector<double>& freq, const std::vector<double>& p, int draws) {
  ASSERT_EQ(freq.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double sd = std::sqrt(p[i] * (1 - p[i]) / draws);
    EXPECT_NEAR(freq[i], p[i], 5 * sd + 1e-9) << "token " << i;
  }
}

SamplingParams Seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 6);
  std::vector<float> logits = {1, 5, 2, 5, -1, 5};
  EXPECT_EQ(s.Sample(logits).token, 1);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> l = {0.5f, -3, 7.25f, 7.0f, 7.25f, 1};
    EXPECT_EQ(s.Sample(l).token, 2);
  }
}

TEST(SamplerTest, GreedyIgnoresNanAndHandlesAllMasked) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> l = {nan, 1, nan, 3};
  EXPECT_EQ(s.Sample(l).token, 3);
  std::vector<float> masked = {ninf, ninf, ninf, ninf};
  EXPECT_EQ(s.Sample(masked).token, 0);  // defined, not a crash
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferent) {
  std::vector<float> logits(1000);
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  for (float& v : logits) v = nd(g);
  auto run = [&](SamplingParams p) {
    Sampler s(p, 1000);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> l = logits;
      out.push_back(s.Sample(l).token);
    }
    return out;
  };
  for (SamplingParams p : {Seeded(42), [] {
                             SamplingParams q = Seeded(42);
                             q.top_k = 50;
                             q.top_p = 0.9f;
                             q.min_p = 0.01f;
                             return q;
                           }()}) {
    EXPECT_EQ(run(p), run(p));
    SamplingParams other = p;
    other.seed = 43;
    EXPECT_NE(run(p), run(other));
  }
  // Without a seed each sampler draws its own.
  Sampler a(SamplingParams(), 10), b(SamplingParams(), 10);
  EXPECT_NE(a.seed(), b.seed());
  EXPECT_EQ(Sampler(Seeded(9), 10).seed(), 9u);
}

TEST(SamplerTest, FrequenciesMatchSoftmaxAtSeveralTemperatures) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f, -3.0f};
  const int draws = 100000;
  for (float t : {1.0f, 0.5f, 1.7f}) {
    SamplingParams p = Seeded(1234);
    p.temperature = t;
    Sampler s(p, static_cast<int32_t>(logits.size()));
    ExpectMatches(Frequencies(s, logits, draws), Softmax(logits, t), draws);
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKBestRenormalized) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.5f, -1.0f, 2.0f, 0.7f, 1.9f, 3.0f};
  SamplingParams p = Seeded(5);
  p.top_k = 3;  // 7 (3.0), then 1 and 4 (2.0, lowest ids on the tie before 6)
  Sampler s(p, 8);
  const int draws = 60000;
  std::vector<double> f = Frequencies(s, logits, draws);
  std::vector<float> kept = {logits[7], logits[1], logits[4]};
  std::vector<double> pk = Softmax(kept, 1.0);
  std::vector<double> expect(8, 0.0);
  expect[7] = pk[0];
  expect[1] = pk[1];
  expect[4] = pk[2];
  ExpectMatches(f, expect, draws);
  EXPECT_EQ(f[6], 0.0);
}

// The smallest most-likely-first prefix whose mass reaches top_p.
std::set<int32_t> Nucleus(const std::vector<float>& logits, double t, double top_p) {
  std::vector<double> p = Softmax(logits, t);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  std::set<int32_t> keep;
  double cum = 0;
  for (int32_t id : order) {
    keep.insert(id);
    cum += p[id];
    if (cum >= top_p) break;
  }
  return keep;
}

TEST(SamplerTest, TopPKeepsTheNucleusRenormalized) {
  // Probabilities 0.5, 0.25, 0.15, 0.1 (logs of them as logits).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.1f),
                                     std::log(0.25f)};
  SamplingParams p = Seeded(77);
  p.top_p = 0.7f;
  Sampler s(p, 4);
  const int draws = 60000;
  std::vector<double> f = Frequencies(s, logits, draws);
  ExpectMatches(f, {0.0, 2.0 / 3, 0.0, 1.0 / 3}, draws);
}

TEST(SamplerTest, TopPOnLargeVocabularyWithWideNucleus) {
  // Flat logits give nuclei of thousands of tokens; the top_p close to 1
  // needs tokens below the sampler's first two collection thresholds.
  const int32_t vocab = 20000;
  struct Case {
    float lo, top_p, temperature;
  };
  for (Case c :
       {Case{-8.0f, 0.9f, 1.0f}, Case{-8.0f, 0.5f, 0.3f}, Case{-20.0f, 0.9999999f, 1.0f}}) {
    std::vector<float> logits(vocab);
    std::mt19937 g(3);
    std::uniform_real_distribution<float> ud(c.lo, 0.0f);
    for (float& v : logits) v = ud(g);
    SamplingParams p = Seeded(11);
    p.top_p = c.top_p;
    p.temperature = c.temperature;
    Sampler s(p, vocab);
    std::set<int32_t> nucleus = Nucleus(logits, c.temperature, c.top_p);
    std::set<int32_t> seen;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> l = logits;
      int32_t tok = s.Sample(l).token;
      ASSERT_TRUE(nucleus.count(tok)) << tok << " top_p " << c.top_p;
      seen.insert(tok);
    }
    EXPECT_GT(seen.size(), 50u);
    if (c.top_p < 0.99f) {
      EXPECT_LT(nucleus.size(), static_cast<size_t>(vocab) * 9 / 10);
    }
  }
}

TEST(SamplerTest, TopKThenTopPThenMinP) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f),  std::log(0.1f),
                                     std::log(0.1f), std::log(0.05f), std::log(0.05f)};
  {
    // top_k 4 -> {0.4,.3,.1,.1}/0.9; top_p 0.8 of that needs 0.72: 0, 1, 2.
    SamplingParams p = Seeded(8);
    p.top_k = 4;
    p.top_p = 0.8f;
    Sampler s(p, 6);
    const int draws = 50000;
    ExpectMatches(Frequencies(s, logits, draws), {0.5, 0.375, 0.125, 0, 0, 0}, draws);
  }
  {
    // min_p 0.2 keeps p >= 0.08: ids 0..3.
    SamplingParams p = Seeded(9);
    p.min_p = 0.2f;
    Sampler s(p, 6);
    const int draws = 50000;
    ExpectMatches(Frequencies(s, logits, draws), {0.4 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0.1 / 0.9, 0, 0},
                  draws);
  }
  {
    // min_p is relative to the best token after temperature: at T=0.5 the
    // ratios square, 0.1/0.4 -> 1/16 < 0.1, so only ids 0 and 1 remain.
    SamplingParams p = Seeded(10);
    p.min_p = 0.1f;
    p.temperature = 0.5f;
    p.top_k = 5;  // exercise the sorted path too
    Sampler s(p, 6);
    const int draws = 50000;
    ExpectMatches(Frequencies(s, logits, draws), {16.0 / 25, 9.0 / 25, 0, 0, 0, 0}, draws);
  }
}

TEST(SamplerTest, MaskedLogitsAreNeverSampled) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> logits = {ninf, 0.0f, ninf, 0.0f, ninf};
  for (int32_t top_k : {0, 2, 4}) {
    for (float top_p : {1.0f, 0.999f}) {
      SamplingParams p = Seeded(4);
      p.top_k = top_k;
      p.top_p = top_p;
      Sampler s(p, 5);
      std::vector<double> f = Frequencies(s, logits, 4000);
      EXPECT_EQ(f[0] + f[2] + f[4], 0.0) << top_k << " " << top_p;
      EXPECT_GT(f[1], 0.4);
      EXPECT_GT(f[3], 0.4);
    }
  }
}

TEST(SamplerTest, PenaltiesFollowTheFormulas) {
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 6);
  const std::vector<int32_t> prompt = {0, 1, 0, 99, -4};  // out-of-range ids ignored
  s.AddPrompt(prompt);
  s.AddOutput(1);
  s.AddOutput(2);
  s.AddOutput(2);
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
  s.ApplyPenalties(l);
  EXPECT_FLOAT_EQ(l[0], 2.0f / 1.3f);                        // prompt only
  EXPECT_FLOAT_EQ(l[1], -1.0f * 1.3f - (0.25f * 1 + 0.5f));  // prompt + 1 output
  EXPECT_FLOAT_EQ(l[2], 0.5f / 1.3f - (0.25f * 2 + 0.5f));   // 2 outputs
  EXPECT_FLOAT_EQ(l[3], 3.0f);
  EXPECT_FLOAT_EQ(l[4], -2.0f);
  EXPECT_FLOAT_EQ(l[5], 1.0f);
}

TEST(SamplerTest, SampledTokensFeedThePenalties) {
  // Greedy with a strong frequency penalty must move off a token once it
  // has been produced enough times.
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0f;
  Sampler s(p, 3);
  std::vector<int32_t> out;
  for (int i = 0; i < 4; ++i) {
    std::vector<float> l = {3.0f, 0.0f, 0.5f};
    out.push_back(s.Sample(l).token);
  }
  // Token 0 scores 3, 1, -1 after 0, 1, 2 uses; token 2 drops to -1.5 once used.
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0, 2, 1}));
}

TEST(SamplerTest, RepetitionPenaltyCanChangeGreedyChoice) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 3);
  std::vector<int32_t> prompt = {0};
  s.AddPrompt(prompt);
  std::vector<float> l = {4.0f, 3.0f, -1.0f};  // 4/2 = 2 < 3
  EXPECT_EQ(s.Sample(l).token, 1);
}

// logprobs are log-softmax of what the draw sees: penalized logits over the
// temperature, tracked across steps as the penalties grow.
TEST(SamplerTest, LogprobsFollowPenaltiesAndTemperature) {
  SamplingParams p = Seeded(2);
  p.logprobs = 3;
  p.temperature = 0.3f;
  p.frequency_penalty = 1.0f;
  Sampler s(p, 5);
  const std::vector<float> raw = {1.0f, 4.0f, 2.0f, 4.0f, -1.0f};
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 6; ++i) {
    std::vector<float> pen = raw;
    for (size_t j = 0; j < pen.size(); ++j) pen[j] -= static_cast<float>(counts[j]);
    const std::vector<double> ref = Softmax(pen, 0.3);
    std::vector<size_t> order(5);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return pen[x] > pen[y]; });
    std::vector<float> l = raw;
    SampledToken t = s.Sample(l);
    ASSERT_TRUE(t.logprob.has_value());
    EXPECT_NEAR(*t.logprob, std::log(ref[static_cast<size_t>(t.token)]), 1e-5);
    ASSERT_EQ(t.top_logprobs.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(t.top_logprobs[k].token, static_cast<int32_t>(order[k])) << "step " << i;
      EXPECT_NEAR(t.top_logprobs[k].logprob, std::log(ref[order[k]]), 1e-5);
    }
    ++counts[static_cast<size_t>(t.token)];
  }
  SamplingParams none = Seeded(2);
  Sampler n(none, 5);
  std::vector<float> l = raw;
  SampledToken t = n.Sample(l);
  EXPECT_FALSE(t.logprob.has_value());
  EXPECT_TRUE(t.top_logprobs.empty());
}

// Greedy: temperature 1 (the logits as they are); ties keep the lowest id
// first; asking for logprobs changes no token of a seeded run.
TEST(SamplerTest, GreedyLogprobsAreLogSoftmaxOfTheLogits) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  Sampler s(p, 4);
  const std::vector<float> raw = {0.5f, 3.0f, 3.0f, -2.0f};
  const std::vector<double> ref = Softmax(raw, 1.0);
  std::vector<float> l = raw;
  SampledToken t = s.Sample(l);
  EXPECT_EQ(t.token, 1);
  EXPECT_NEAR(*t.logprob, std::log(ref[1]), 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 2u);
  EXPECT_EQ(t.top_logprobs[0].token, 1);
  EXPECT_EQ(t.top_logprobs[1].token, 2);

  SamplingParams a = Seeded(9), b = Seeded(9);
  a.temperature = b.temperature = 0.8f;
  b.logprobs = 5;
  Sampler sa(a, 4), sb(b, 4);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> la = raw, lb = raw;
    EXPECT_EQ(sa.Sample(la).token, sb.Sample(lb).token);
  }
}

// Masked tokens (-inf, a grammar's) never appear among the top logprobs,
// even when fewer tokens are allowed than asked for.
TEST(SamplerTest, TopLogprobsLeaveMaskedTokensOut) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (float temperature : {0.0f, 0.7f}) {
    SamplingParams p = Seeded(3);
    p.temperature = temperature;
    p.logprobs = 4;
    Sampler s(p, 5);
    std::vector<float> l = {ninf, 1.0f, ninf, 2.0f, ninf};
    SampledToken t = s.Sample(l);
    ASSERT_EQ(t.top_logprobs.size(), 2u) << temperature;
    EXPECT_EQ(t.top_logprobs[0].token, 3);
    EXPECT_EQ(t.top_logprobs[1].token, 1);
    for (const TokenLogprob& e : t.top_logprobs) EXPECT_TRUE(std::isfinite(e.logprob));
    EXPECT_TRUE(std::isfinite(*t.logprob));
  }
}

// NextDraw advances the generator as Sample does, so a sequence drawn by a
// backend gives the tokens the Sampler would have given.
TEST(SampleDrawTest, NextDrawGivesSamplesTokens) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.min_p = 0.01f;
  p.seed = 1234;
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.37f * i) * 4.0f;
  Sampler host(p, 300), device(p, 300);
  std::vector<int32_t> a, b;
  for (int i = 0; i < 64; ++i) {
    std::vector<float> buf = logits;
    a.push_back(host.Sample(buf).token);
    const backend::SampleSettings s = device.NextDraw();
    EXPECT_GE(s.u, 0.0);
    EXPECT_LT(s.u, 1.0);
    EXPECT_EQ(s.temperature, p.temperature);
    EXPECT_EQ(s.top_k, p.top_k);
    EXPECT_EQ(s.top_p, p.top_p);
    EXPECT_EQ(s.min_p, p.min_p);
    buf = logits;
    b.push_back(backend::SampleDraw(buf, s));
    device.AddOutput(b.back());
  }
  EXPECT_EQ(a, b);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 3u);  // it did sample
}

}  // namespace
}  // namespace agentkv::engine
