#include "engine/model/quant_pack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/model/quant_format.h"
#include "quant_test_util.h"

namespace agentkv::model {
namespace {

using testing::RefE4m3;
using testing::RefFp4;

// The e4m3 code nearest to x by brute force over every finite code, ties to
// the even code, saturating at +-448.
uint8_t NearestE4m3(float x) {
  if (std::fabs(x) >= 448.f) return x < 0 ? 0xFE : 0x7E;
  int best = -1;
  double bd = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = RefE4m3(static_cast<uint8_t>(c));
    if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::fabs(static_cast<double>(v) - x);
    if (best < 0 || d < bd || (d == bd && c % 2 == 0)) {
      best = c;
      bd = d;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(QuantPackTest, E4m3RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = RefE4m3(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(F32ToE4m3(v), c) << c;
  }
}

TEST(QuantPackTest, E4m3RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float x = (rng() & 1 ? -1.f : 1.f) * std::exp2(mag(rng));
    ASSERT_EQ(F32ToE4m3(x), NearestE4m3(x)) << x;
  }
  // Exact midpoints: between 1 (0x38) and 1.125 (0x39) goes to the even
  // 0x38; between 1.125 and 1.25 (0x3A) to 0x3A.
  EXPECT_EQ(F32ToE4m3(1.0625f), 0x38);
  EXPECT_EQ(F32ToE4m3(1.1875f), 0x3A);
  EXPECT_EQ(F32ToE4m3(-1.1875f), 0xBA);
  // Half the smallest subnormal ties to zero; just above it rounds up.
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.f, -10)), 0x00);
  EXPECT_EQ(F32ToE4m3(std::nextafter(std::ldexp(1.f, -10), 1.f)), 0x01);
  EXPECT_EQ(F32ToE4m3(1000.f), 0x7E);
  EXPECT_EQ(F32ToE4m3(-1e30f), 0xFE);
  EXPECT_EQ(F32ToE4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(F32ToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(QuantPackTest, Fp4Nearest) {
  EXPECT_EQ(F32ToFp4(0.f), 0);
  EXPECT_EQ(F32ToFp4(0.25f), 0);  // tie: 0 (code 0) over 0.5 (code 1)
  EXPECT_EQ(F32ToFp4(0.75f), 2);  // tie: 1.0 (code 2) over 0.5
  EXPECT_EQ(F32ToFp4(2.5f), 4);   // tie: 2 (code 4) over 3
  EXPECT_EQ(F32ToFp4(5.f), 6);    // tie: 4 (code 6) over 6
  EXPECT_EQ(F32ToFp4(5.1f), 7);
  EXPECT_EQ(F32ToFp4(100.f), 7);  // saturates at 6
  EXPECT_EQ(F32ToFp4(-1.4f), 8 | 3);
  for (int n = 0; n < 16; ++n) {
    if (n == 8) continue;  // -0 packs as +0's magnitude with the sign bit
    EXPECT_EQ(F32ToFp4(RefFp4(static_cast<uint8_t>(n))), n) << n;
  }
}

TEST(QuantPackTest, Mxfp4ScaleIsAmaxOverSixRoundedUpToAPowerOfTwo) {
  const int64_t rows = 3, cols = 96;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> w(rows * cols);
  for (auto& x : w) x = nd(rng);
  for (int i = 0; i < 32; ++i) w[cols + 32 + i] = 0.f;  // an all-zero group
  w[2 * cols] = 12.f;                                   // amax / 6 exactly 2: scale 2
  std::vector<uint8_t> blocks(rows * cols / 2), exps(rows * cols / 32);
  PackMxfp4(w.data(), rows, cols, blocks.data(), exps.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / 32; ++g) {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(w[r * cols + g * 32 + i]));
      const int e = exps[r * 3 + g] - 127;
      if (amax == 0) {
        EXPECT_EQ(e, 0);
        continue;
      }
      // 2^e >= amax / 6 > 2^(e-1)
      EXPECT_GE(std::ldexp(1.0, e), amax / 6.0) << r << " " << g;
      EXPECT_LT(std::ldexp(1.0, e - 1), amax / 6.0) << r << " " << g;
      for (int i = 0; i < 32; ++i) {
        const int64_t c = g * 32 + i;
        const uint8_t byte = blocks[(r * cols + c) / 2];
        const uint8_t nib = c % 2 ? byte >> 4 : byte & 15;
        const float x = w[r * cols + c] / std::ldexp(1.f, e);
        // The nearest representable value: no code is closer.
        for (int n = 0; n < 16; ++n)
          EXPECT_LE(std::fabs(RefFp4(nib) - x), std::fabs(RefFp4(static_cast<uint8_t>(n)) - x));
      }
    }
  EXPECT_EQ(exps[2 * 3 + 0], 128);  // 12 / 6 = 2 = 2^1
  // And the library decodes what was packed to within half a step.
  QuantizedWeight q;
  q.format = QuantFormat::kMxfp4;
  q.rows = rows;
  q.cols = cols;
  q.codes = blocks;
  q.exponents = exps;
  std::vector<float> back(rows * cols);
  DequantizeRows(q, 0, 0, rows, back.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float s = std::ldexp(1.f, exps[i / 32] - 127);
    EXPECT_LE(std::fabs(back[i] - w[i]), s * 1.0f + 1e-12f) << i;
  }
}

TEST(QuantPackTest, Fp8BlockScalesPerRaggedTile) {
  const int64_t rows = 5, cols = 7;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(rows * cols);
  for (auto& x : w) x = nd(rng);
  for (int64_t c = 3; c < 6; ++c) w[4 * cols + c] = 0.f;  // tile (2, 1) is all zero (1 x 3)
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> s(3 * 3);
  PackFp8Block(w.data(), rows, cols, 2, 3, codes.data(), s.data());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      float amax = 0;
      for (int64_t r = i * 2; r < std::min<int64_t>(rows, i * 2 + 2); ++r)
        for (int64_t c = j * 3; c < std::min<int64_t>(cols, j * 3 + 3); ++c)
          amax = std::max(amax, std::fabs(w[r * cols + c]));
      EXPECT_EQ(s[i * 3 + j], amax > 0 ? amax / 448.f : 1.f) << i << " " << j;
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float sc = s[(r / 2) * 3 + c / 3];
      EXPECT_EQ(codes[r * cols + c], NearestE4m3(w[r * cols + c] / sc)) << r << " " << c;
      // e4m3 keeps 3 mantissa bits: relative error at most 2^-4 of the value
      // (or of the smallest normal, scaled).
      const float back = RefE4m3(codes[r * cols + c]) * sc;
      EXPECT_LE(std::fabs(back - w[r * cols + c]),
                std::fabs(w[r * cols + c]) / 16.f + sc * std::ldexp(1.f, -10));
    }
}

TEST(QuantPackTest, Fp8ChannelScalesPerRow) {
  const int64_t rows = 4, cols = 10;
  std::vector<float> w(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) w[i] = std::sin(static_cast<float>(i)) * (i / 10 + 1);
  for (int64_t c = 0; c < cols; ++c) w[2 * cols + c] = 0.f;
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> s(rows);
  PackFp8Channel(w.data(), rows, cols, codes.data(), s.data());
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    EXPECT_EQ(s[r], amax > 0 ? amax / 448.f : 1.f);
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(codes[r * cols + c], NearestE4m3(w[r * cols + c] / s[r]));
  }
}

}  // namespace
}  // namespace agentkv::model
