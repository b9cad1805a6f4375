#include "engine/model/quant_format.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

namespace agentkv::model {
namespace {

float DecodeE4m3(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xF, mant = code & 7;
  if (exp == 0xF && mant == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant) / 8.f, -6)
                             : std::ldexp(1.f + static_cast<float>(mant) / 8.f, exp - 7);
  return sign ? -mag : mag;
}

// Decoded once: the dequantization loops look every code up.
const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = DecodeE4m3(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

constexpr std::array<float, 16> kFp4 = {0.f,  .5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                        -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string_view QuantFormatName(QuantFormat f) {
  switch (f) {
    case QuantFormat::kMxfp4:
      return "mxfp4";
    case QuantFormat::kFp8Block:
      return "fp8-block";
    case QuantFormat::kFp8Channel:
      return "fp8-channel";
    case QuantFormat::kFp8Tensor:
      return "fp8-tensor";
  }
  return "unknown";
}

float E4m3ToF32(uint8_t code) { return E4m3Table()[code]; }

float Fp4ToF32(uint8_t nibble) { return kFp4[nibble & 0xF]; }

float E8m0ToF32(uint8_t e) {
  if (e == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.f, static_cast<int>(e) - 127);
}

uint64_t QuantizedWeight::bytes() const {
  return codes.size() + exponents.size() + scales.size() * sizeof(float);
}

Status QuantizedWeight::Validate() const {
  const std::string what = std::string(QuantFormatName(format)) + " weight";
  if (batch <= 0 || rows <= 0 || cols <= 0)
    return InvalidArgument(what + ": empty or negative dimensions");
  const int64_t n = batch * rows * cols;
  auto expect = [&](const char* part, size_t got, int64_t want) -> Status {
    if (static_cast<int64_t>(got) != want)
      return InvalidArgument(what + ": " + part + " holds " + std::to_string(got) +
                             " entries, expected " + std::to_string(want));
    return Status::Ok();
  };
  switch (format) {
    case QuantFormat::kMxfp4:
      if (cols % kMxfp4Block != 0)
        return InvalidArgument(what + ": " + std::to_string(cols) +
                               " input features are not a multiple of 32");
      RETURN_IF_ERROR(expect("codes", codes.size(), n / 2));
      RETURN_IF_ERROR(expect("exponents", exponents.size(), n / kMxfp4Block));
      return expect("scales", scales.size(), 0);
    case QuantFormat::kFp8Block:
      if (block_rows <= 0 || block_cols <= 0)
        return InvalidArgument(what + ": block size must be positive");
      RETURN_IF_ERROR(expect("codes", codes.size(), n));
      return expect("scales", scales.size(),
                    batch * CeilDiv(rows, block_rows) * CeilDiv(cols, block_cols));
    case QuantFormat::kFp8Channel:
      RETURN_IF_ERROR(expect("codes", codes.size(), n));
      return expect("scales", scales.size(), batch * rows);
    case QuantFormat::kFp8Tensor:
      RETURN_IF_ERROR(expect("codes", codes.size(), n));
      return expect("scales", scales.size(), batch);
  }
  return InvalidArgument(what + ": unknown format");
}

void DequantizeRows(const QuantizedWeight& w, int64_t b, int64_t r0, int64_t r1, float* out) {
  const int64_t C = w.cols;
  if (w.format == QuantFormat::kMxfp4) {
    const int64_t groups = C / kMxfp4Block;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t row = b * w.rows + r;
      const uint8_t* bytes = w.codes.data() + row * (C / 2);
      const uint8_t* exps = w.exponents.data() + row * groups;
      float* o = out + (r - r0) * C;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = E8m0ToF32(exps[g]);
        const uint8_t* blk = bytes + g * (kMxfp4Block / 2);
        float* og = o + g * kMxfp4Block;
        for (int i = 0; i < kMxfp4Block / 2; ++i) {
          og[2 * i] = kFp4[blk[i] & 0xF] * s;
          og[2 * i + 1] = kFp4[blk[i] >> 4] * s;
        }
      }
    }
    return;
  }
  const std::array<float, 256>& lut = E4m3Table();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.codes.data() + (b * w.rows + r) * C;
    float* o = out + (r - r0) * C;
    switch (w.format) {
      case QuantFormat::kFp8Block: {
        const int64_t tiles = CeilDiv(C, w.block_cols);
        const float* srow =
            w.scales.data() + (b * CeilDiv(w.rows, w.block_rows) + r / w.block_rows) * tiles;
        for (int64_t t = 0; t < tiles; ++t) {
          const float s = srow[t];
          const int64_t c1 = std::min(C, (t + 1) * w.block_cols);
          for (int64_t c = t * w.block_cols; c < c1; ++c) o[c] = lut[src[c]] * s;
        }
        break;
      }
      case QuantFormat::kFp8Channel: {
        const float s = w.scales[b * w.rows + r];
        for (int64_t c = 0; c < C; ++c) o[c] = lut[src[c]] * s;
        break;
      }
      case QuantFormat::kFp8Tensor: {
        const float s = w.scales[b];
        for (int64_t c = 0; c < C; ++c) o[c] = lut[src[c]] * s;
        break;
      }
      case QuantFormat::kMxfp4:
        break;
    }
  }
}

}  // namespace agentkv::model
