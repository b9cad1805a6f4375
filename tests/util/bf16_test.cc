#include "util/bf16.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace agentkv {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Independent bf16 rounding: pick the nearer of the two bf16 neighbours in
// double arithmetic, ties to the even one.
uint16_t ReferenceBf16(float f) {
  uint32_t u = Bits(f);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffff) == 0) return lo;
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dl = std::fabs(static_cast<double>(Bf16ToF32(lo)) - f);
  double dh = std::isinf(Bf16ToF32(hi)) && !std::isinf(f)
                  ? std::fabs(std::ldexp(1.0, 128) * std::copysign(1.0, f) - f)
                  : std::fabs(static_cast<double>(Bf16ToF32(hi)) - f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // Exactly half-way: ties to even.
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  // Largest float rounds up to infinity, as IEEE rounding says.
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(Bf16Test, NanStaysNan) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(nan))));
  // A signalling NaN whose payload lives only in the dropped bits must not
  // become infinity.
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::bit_cast<float>(0x7f800001u)))));
}

TEST(Bf16Test, MatchesReferenceOnBitPatterns) {
  // Every 2^16 patterns' neighbourhood of low bits, across the exponent range.
  for (uint32_t hi = 0; hi < 0x10000; hi += 7) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1234u}) {
      uint32_t u = (hi << 16) | low;
      float f = std::bit_cast<float>(u);
      if (std::isnan(f)) continue;
      ASSERT_EQ(F32ToBf16(f), ReferenceBf16(f)) << std::hex << u;
    }
  }
}

TEST(Bf16Test, RoundTripIsExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBf16(f), h);
  }
}

// F16C hardware conversion is the reference for fp16.
TEST(F16Test, F16ToF32MatchesHardwareExhaustively) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float want = _cvtsh_ss(static_cast<unsigned short>(h));
    float got = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << std::hex << h;
    }
  }
}

TEST(F16Test, F32ToF16MatchesHardware) {
  // Dense over exponents near and inside the half range (normals,
  // subnormals, overflow, ties) and sparse elsewhere.
  for (uint64_t u = 0; u <= 0xffffffffull;
       u += (u >> 23 & 0xff) >= 100 && (u >> 23 & 0xff) <= 145 ? 37 : 40503) {
    float f = std::bit_cast<float>(static_cast<uint32_t>(u));
    if (std::isnan(f)) continue;
    uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(F32ToF16(f), want) << std::hex << u;
  }
}

TEST(F16Test, SpecialValues) {
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // half-way to 65536: ties to even = inf
  EXPECT_EQ(F32ToF16(65519.99f), 0x7bff);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
}

}  // namespace
}  // namespace agentkv
