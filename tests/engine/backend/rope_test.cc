// RopeInvFreq: the scalings of rotary frequencies against their definitions.
#include "engine/backend/rope.h"

#include <gtest/gtest.h>

#include <cmath>

namespace agentkv::backend {
namespace {

TEST(RopeTest, Llama3ScalingKeepsHighFrequenciesAndScalesLowOnes) {
  model::RopeSpec plain;
  plain.theta = 500000.f;
  model::RopeSpec l3 = plain;
  l3.type = "llama3";
  l3.factor = 8.f;
  l3.original_max_position = 8192;
  const auto a = RopeInvFreq(plain, 128), b = RopeInvFreq(l3, 128);
  EXPECT_FLOAT_EQ(a[0], b[0]);                // wavelength 2*pi: untouched
  EXPECT_FLOAT_EQ(a.back() / 8.f, b.back());  // longest wavelengths: divided by factor
}

// GPT-OSS's rope: theta 150000, head_dim 64, factor 32, beta 32 / 1 over an
// original context of 4096. The correction range, worked out by hand:
// low = 64 ln(4096 / (32 * 2 pi)) / (2 ln 150000) = 8.093..., high = 64
// ln(4096 / (2 pi)) / (2 ln 150000) = 17.398...; dimensions up to low keep
// their frequency, those from high on are divided by 32, a ramp between.
model::RopeSpec GptOssRope(bool truncate) {
  model::RopeSpec r;
  r.type = "yarn";
  r.theta = 150000.f;
  r.factor = 32.f;
  r.beta_fast = 32.f;
  r.beta_slow = 1.f;
  r.original_max_position = 4096;
  r.truncate = truncate;
  return r;
}

TEST(RopeTest, YarnInvFreqAgainstItsDefinition) {
  model::RopeSpec plain;
  plain.theta = 150000.f;
  const auto base = RopeInvFreq(plain, 64);
  const double kPi = 3.14159265358979323846;
  const double low = 64 * std::log(4096 / (32 * 2 * kPi)) / (2 * std::log(150000.0));
  const double high = 64 * std::log(4096 / (1 * 2 * kPi)) / (2 * std::log(150000.0));
  ASSERT_NEAR(low, 8.093, 1e-3);
  ASSERT_NEAR(high, 17.398, 1e-3);
  for (bool truncate : {false, true}) {
    const auto yarn = RopeInvFreq(GptOssRope(truncate), 64);
    ASSERT_EQ(yarn.size(), 32u);
    const double lo = truncate ? 8.0 : low, hi = truncate ? 18.0 : high;
    for (int i = 0; i < 32; ++i) {
      const double ramp = std::min(1.0, std::max(0.0, (i - lo) / (hi - lo)));
      const double want = base[i] * (1 - ramp) + base[i] / 32 * ramp;
      EXPECT_NEAR(yarn[i], want, 1e-6 * base[i]) << "i " << i << " truncate " << truncate;
    }
    EXPECT_FLOAT_EQ(yarn[0], base[0]);
    EXPECT_FLOAT_EQ(yarn[8], base[8]);
    EXPECT_FLOAT_EQ(yarn[18], base[18] / 32);
    EXPECT_FLOAT_EQ(yarn[31], base[31] / 32);
  }
}

TEST(RopeTest, YarnAttentionFactor) {
  EXPECT_NEAR(RopeAttentionFactor(GptOssRope(false)), 0.1 * std::log(32.0) + 1, 1e-6);
  model::RopeSpec r = GptOssRope(false);
  r.attention_factor = 1.5f;  // given explicitly
  EXPECT_FLOAT_EQ(RopeAttentionFactor(r), 1.5f);
  r = GptOssRope(false);
  r.mscale = 1.f;
  r.mscale_all_dim = 0.5f;  // DeepSeek style: the ratio of the two mscales
  EXPECT_NEAR(RopeAttentionFactor(r), (0.1 * std::log(32.0) + 1) / (0.05 * std::log(32.0) + 1),
              1e-6);
  r = GptOssRope(false);
  r.factor = 1.f;  // no scaling: no factor
  EXPECT_FLOAT_EQ(RopeAttentionFactor(r), 1.f);
  model::RopeSpec plain;
  EXPECT_FLOAT_EQ(RopeAttentionFactor(plain), 1.f);
}

}  // namespace
}  // namespace agentkv::backend
