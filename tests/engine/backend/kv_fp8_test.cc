// e4m3 encode/decode against values worked out by hand (1 sign bit, 4
// exponent bits with bias 7, 3 mantissa bits; max 448; no infinities; NaN
// 0x7f / 0xff; round to nearest even), and the per-row quantization.
#include "engine/backend/kv_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace agentkv::backend::kvfp8 {
namespace {

TEST(KvFp8Test, DecodeMatchesHandTable) {
  struct Case {
    uint8_t bits;
    float value;
  };
  const Case cases[] = {
      {0x00, 0.f},           {0x01, 0.001953125f},  // 1 * 2^-9, smallest subnormal
      {0x07, 0.013671875f},                         // 7 * 2^-9, largest subnormal
      {0x08, 0.015625f},                            // 2^-6, smallest normal
      {0x30, 0.5f},          {0x38, 1.f},          {0x39, 1.125f}, {0x3f, 1.875f},
      {0x40, 2.f},           {0x50, 8.f},          {0x77, 240.f},  {0x78, 256.f},
      {0x7d, 416.f},         {0x7e, 448.f},        {0xb8, -1.f},   {0xfe, -448.f},
      {0x81, -0.001953125f},
  };
  for (const Case& c : cases) EXPECT_EQ(Decode(c.bits), c.value) << std::hex << int(c.bits);
  EXPECT_TRUE(std::signbit(Decode(0x80)));
  EXPECT_EQ(Decode(0x80), 0.f);
  EXPECT_TRUE(std::isnan(Decode(0x7f)));
  EXPECT_TRUE(std::isnan(Decode(0xff)));
  // The table DequantizeRow reads is Decode.
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(DecodeTable()[b], Decode(static_cast<uint8_t>(b))) << b;
  }
}

TEST(KvFp8Test, EncodeRoundsToNearestEvenAndSaturates) {
  struct Case {
    float value;
    uint8_t bits;
  };
  const Case cases[] = {
      {0.f, 0x00},           {1.f, 0x38}, {1.0625f, 0x38},  // halfway 1 / 1.125: even mantissa 0
      {1.1875f, 0x3a},                                      // halfway 1.125 / 1.25: even mantissa 2
      {1.07f, 0x39},                                        // nearer 1.125
      {15.5f, 0x58},          // halfway 15 / 16: carries into the exponent
      {432.f, 0x7e},          // halfway 416 / 448: even (448)
      {420.f, 0x7d},          // nearer 416
      {449.f, 0x7e},          // saturates
      {1e9f, 0x7e},           //
      {-1e9f, 0xfe},          //
      {0.0009765625f, 0x00},  // 2^-10, halfway 0 / 2^-9: even (0)
      {0.0029296875f, 0x02},  // 3 * 2^-10, halfway 2^-9 / 2^-8: even (2)
      {0.0146484375f, 0x08},  // 7.5 * 2^-9: even, the smallest normal
      {0.0001f, 0x00},        // underflows to zero
      {-2.f, 0xc0},
  };
  for (const Case& c : cases) EXPECT_EQ(int(Encode(c.value)), int(c.bits)) << c.value;
  EXPECT_EQ(Encode(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(Encode(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(Encode(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(Encode(-0.f), 0x80);
}

TEST(KvFp8Test, EveryCodeRoundTripsAndMidpointsGoToEven) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(int(Encode(Decode(static_cast<uint8_t>(b)))), b);
  }
  for (int b = 0; b < 0x7e; ++b) {  // consecutive positive codes
    const float lo = Decode(static_cast<uint8_t>(b)), hi = Decode(static_cast<uint8_t>(b + 1));
    const float mid = (lo + hi) / 2;  // exact in float
    EXPECT_EQ(int(Encode(mid)), (b % 2 == 0) ? b : b + 1) << b;
    EXPECT_EQ(int(Encode(std::nextafter(mid, 0.f))), b) << b;
    EXPECT_EQ(int(Encode(std::nextafter(mid, 1000.f))), b + 1) << b;
  }
}

TEST(KvFp8Test, QuantizeRowScalesByAmax) {
  const float row[4] = {0.f, 1.f, -2.f, 4.f};
  uint8_t q[4];
  const float scale = QuantizeRow(row, 4, q);
  EXPECT_EQ(scale, 4.f / 448.f);
  // x * 448 / 4: 0, 112 (1.75 * 2^6), -224 (1.75 * 2^7), 448.
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[1], 0x6e);
  EXPECT_EQ(q[2], 0xf6);
  EXPECT_EQ(q[3], 0x7e);
  float back[4];
  DequantizeRow(q, scale, 4, back);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], row[i], 1e-6f);

  const float zeros[3] = {0.f, -0.f, 0.f};
  uint8_t z[3] = {1, 1, 1};
  EXPECT_EQ(QuantizeRow(zeros, 3, z), 0.f);
  EXPECT_EQ(z[0], 0);
  EXPECT_EQ(z[2], 0);
}

TEST(KvFp8Test, RandomRowsStayWithinHalfAStep) {
  std::vector<float> row(128);
  std::vector<uint8_t> q(128);
  std::vector<float> back(128);
  uint32_t s = 12345;
  for (int trial = 0; trial < 50; ++trial) {
    const float mag = std::ldexp(1.f, trial % 20 - 10);  // 2^-10 .. 2^9
    for (float& x : row) {
      s = s * 1664525u + 1013904223u;
      x = mag * (static_cast<float>(s >> 8) / 16777216.f * 2.f - 1.f);
    }
    const float scale = QuantizeRow(row.data(), 128, q.data());
    DequantizeRow(q.data(), scale, 128, back.data());
    for (int i = 0; i < 128; ++i) {
      // Half of e4m3's step: 1/16 relative, 2^-10 * scale in the subnormals.
      EXPECT_LE(std::fabs(back[i] - row[i]),
                std::max(std::fabs(row[i]) / 16, scale / 1024) * 1.001f)
          << trial << " " << i;
    }
  }
}

TEST(KvFp8Test, SectionLayout) {
  EXPECT_EQ(SectionBytes(16, 8, 128), 16 * 8 * 132);
  EXPECT_EQ(ScalesOffset(16, 8, 128), 16 * 8 * 128);
}

}  // namespace
}  // namespace agentkv::backend::kvfp8
