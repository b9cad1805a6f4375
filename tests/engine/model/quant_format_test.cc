#include "engine/model/quant_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "quant_test_util.h"

namespace agentkv::model {
namespace {

using ::testing::HasSubstr;
using testing::RefE4m3;
using testing::RefFp4;

TEST(QuantFormatTest, E4m3AllCodesMatchAnIndependentDecode) {
  for (int c = 0; c < 256; ++c) {
    const float want = RefE4m3(static_cast<uint8_t>(c));
    const float got = E4m3ToF32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(got, want) << c;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << c;
    }
  }
}

TEST(QuantFormatTest, E4m3LandmarkCodes) {
  EXPECT_EQ(E4m3ToF32(0x00), 0.f);
  EXPECT_TRUE(std::signbit(E4m3ToF32(0x80)));
  EXPECT_EQ(E4m3ToF32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(E4m3ToF32(0x07), 7.f / 512.f);          // largest subnormal
  EXPECT_EQ(E4m3ToF32(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(E4m3ToF32(0x38), 1.f);
  EXPECT_EQ(E4m3ToF32(0xB8), -1.f);
  EXPECT_EQ(E4m3ToF32(0x7E), 448.f);
  EXPECT_EQ(E4m3ToF32(0xFE), -448.f);
  EXPECT_EQ(E4m3ToF32(0x78), 256.f);  // exponent 15 is finite except mantissa 7
  EXPECT_TRUE(std::isnan(E4m3ToF32(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToF32(0xFF)));
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += std::isnan(E4m3ToF32(static_cast<uint8_t>(c)));
  EXPECT_EQ(nans, 2);
}

TEST(QuantFormatTest, Fp4AndE8m0) {
  const float lut[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  for (int n = 0; n < 16; ++n) {
    EXPECT_EQ(Fp4ToF32(static_cast<uint8_t>(n)), n < 8 ? lut[n] : -lut[n - 8]) << n;
    EXPECT_EQ(Fp4ToF32(static_cast<uint8_t>(n)), RefFp4(static_cast<uint8_t>(n))) << n;
  }
  EXPECT_EQ(Fp4ToF32(0xF3), 1.5f);  // only the low nibble counts
  EXPECT_EQ(E8m0ToF32(127), 1.f);
  EXPECT_EQ(E8m0ToF32(0), std::ldexp(1.f, -127));
  EXPECT_EQ(E8m0ToF32(254), std::ldexp(1.f, 127));
  EXPECT_EQ(E8m0ToF32(120), 1.f / 128.f);
  EXPECT_TRUE(std::isnan(E8m0ToF32(255)));
}

QuantizedWeight RandomFp8(QuantFormat f, int64_t batch, int64_t rows, int64_t cols, int br, int bc,
                          uint32_t seed) {
  std::mt19937 rng(seed);
  QuantizedWeight w;
  w.format = f;
  w.batch = batch;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = br;
  w.block_cols = bc;
  w.codes.resize(batch * rows * cols);
  for (auto& c : w.codes) {
    do c = static_cast<uint8_t>(rng());
    while ((c & 0x7F) == 0x7F);  // no NaN codes
  }
  int64_t ns = batch;
  if (f == QuantFormat::kFp8Channel) ns = batch * rows;
  if (f == QuantFormat::kFp8Block) ns = batch * ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
  std::uniform_real_distribution<float> u(0.001f, 0.1f);
  w.scales.resize(ns);
  for (auto& s : w.scales) s = u(rng);
  return w;
}

TEST(QuantFormatTest, Fp8BlockRaggedEdges) {
  // 5 x 7 with 2 x 3 tiles: the last tile row has one row, the last tile
  // column one column.
  for (int64_t batch : {1, 3}) {
    QuantizedWeight w = RandomFp8(QuantFormat::kFp8Block, batch, 5, 7, 2, 3, 11);
    ASSERT_TRUE(w.Validate().ok()) << w.Validate().ToString();
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<float> out(5 * 7);
      DequantizeRows(w, b, 0, 5, out.data());
      for (int64_t r = 0; r < 5; ++r)
        for (int64_t c = 0; c < 7; ++c) {
          const float s = w.scales[(b * 3 + r / 2) * 3 + c / 3];
          EXPECT_EQ(out[r * 7 + c], RefE4m3(w.codes[(b * 5 + r) * 7 + c]) * s) << r << "," << c;
        }
      // A row range: rows 3 and 4 only.
      std::vector<float> part(2 * 7);
      DequantizeRows(w, b, 3, 5, part.data());
      for (int i = 0; i < 14; ++i) EXPECT_EQ(part[i], out[3 * 7 + i]);
    }
  }
}

TEST(QuantFormatTest, Fp8ChannelAndTensor) {
  QuantizedWeight ch = RandomFp8(QuantFormat::kFp8Channel, 2, 4, 9, 0, 0, 5);
  QuantizedWeight te = RandomFp8(QuantFormat::kFp8Tensor, 2, 4, 9, 0, 0, 6);
  ASSERT_TRUE(ch.Validate().ok());
  ASSERT_TRUE(te.Validate().ok());
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<float> a(4 * 9), t(4 * 9);
    DequantizeRows(ch, b, 0, 4, a.data());
    DequantizeRows(te, b, 0, 4, t.data());
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 9; ++c) {
        EXPECT_EQ(a[r * 9 + c], RefE4m3(ch.codes[(b * 4 + r) * 9 + c]) * ch.scales[b * 4 + r]);
        EXPECT_EQ(t[r * 9 + c], RefE4m3(te.codes[(b * 4 + r) * 9 + c]) * te.scales[b]);
      }
  }
}

TEST(QuantFormatTest, Fp8NanCodesStayNan) {
  QuantizedWeight w = RandomFp8(QuantFormat::kFp8Tensor, 1, 1, 4, 0, 0, 1);
  w.codes = {0x7F, 0xFF, 0x38, 0x00};
  w.scales = {2.f};
  std::vector<float> out(4);
  DequantizeRows(w, 0, 0, 1, out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 2.f);
  EXPECT_EQ(out[3], 0.f);
}

TEST(QuantFormatTest, Mxfp4LowNibbleFirstAndScales) {
  const int64_t batch = 2, rows = 3, cols = 64;
  std::mt19937 rng(3);
  QuantizedWeight w;
  w.format = QuantFormat::kMxfp4;
  w.batch = batch;
  w.rows = rows;
  w.cols = cols;
  w.codes.resize(batch * rows * cols / 2);
  w.exponents.resize(batch * rows * cols / 32);
  for (auto& c : w.codes) c = static_cast<uint8_t>(rng());
  for (auto& e : w.exponents) e = static_cast<uint8_t>(110 + rng() % 30);
  ASSERT_TRUE(w.Validate().ok()) << w.Validate().ToString();
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<float> out(rows * cols);
    DequantizeRows(w, b, 0, rows, out.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t row = b * rows + r;
        const uint8_t byte = w.codes[row * cols / 2 + c / 2];
        const uint8_t nib = c % 2 == 0 ? byte & 15 : byte >> 4;
        const float scale = std::pow(2.f, static_cast<float>(w.exponents[row * 2 + c / 32]) - 127);
        EXPECT_EQ(out[r * cols + c], RefFp4(nib) * scale) << b << " " << r << " " << c;
      }
  }
  // Byte 0x71 holds 0.5 (low nibble 1) then 6 (high nibble 7).
  w.codes[0] = 0x71;
  w.exponents[0] = 127;
  std::vector<float> row(cols);
  DequantizeRows(w, 0, 0, 1, row.data());
  EXPECT_EQ(row[0], 0.5f);
  EXPECT_EQ(row[1], 6.f);
}

TEST(QuantFormatTest, ValidateNamesTheBadPart) {
  QuantizedWeight w = RandomFp8(QuantFormat::kFp8Block, 1, 5, 7, 2, 3, 1);
  w.scales.pop_back();
  EXPECT_THAT(w.Validate().message(), HasSubstr("scales"));
  w = RandomFp8(QuantFormat::kFp8Block, 1, 5, 7, 2, 3, 1);
  w.block_rows = 0;
  EXPECT_THAT(w.Validate().message(), HasSubstr("block size"));
  w = RandomFp8(QuantFormat::kFp8Channel, 1, 5, 7, 0, 0, 1);
  w.codes.push_back(0);
  EXPECT_THAT(w.Validate().message(), HasSubstr("codes"));
  w = RandomFp8(QuantFormat::kFp8Tensor, 1, 5, 7, 0, 0, 1);
  w.rows = 0;
  EXPECT_FALSE(w.Validate().ok());
  QuantizedWeight m;
  m.format = QuantFormat::kMxfp4;
  m.rows = 2;
  m.cols = 48;  // not a multiple of 32
  m.codes.resize(48);
  m.exponents.resize(3);
  EXPECT_THAT(m.Validate().message(), HasSubstr("multiple of 32"));
  m.cols = 64;
  m.codes.resize(64);
  m.exponents.resize(3);
  EXPECT_THAT(m.Validate().message(), HasSubstr("exponents"));
  m.exponents.resize(4);
  EXPECT_TRUE(m.Validate().ok());
  EXPECT_EQ(m.bytes(), 64u + 4u);
}

}  // namespace
}  // namespace agentkv::model
