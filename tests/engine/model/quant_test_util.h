// Independent decoders for the quantized formats, written from the format
// definitions (bit construction rather than the library's tables), so tests
// check the library against something it does not share code with.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace agentkv::testing {

// e4m3fn by assembling the fp32 bit pattern.
inline float RefE4m3(uint8_t c) {
  const uint32_t s = c >> 7, e = (c >> 3) & 15u, m = c & 7u;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return (s ? -1.f : 1.f) * static_cast<float>(m) / 512.f;  // m * 2^-9
  return std::bit_cast<float>((s << 31) | ((e - 7 + 127) << 23) | (m << 20));
}

// e2m1 from its fields: exponent bits 1-2 (bias 1), mantissa bit 0.
inline float RefFp4(uint8_t n) {
  const int s = (n >> 3) & 1, e = (n >> 1) & 3, m = n & 1;
  const float mag = e == 0 ? 0.5f * m : std::ldexp(1.f + 0.5f * m, e - 1);
  return s ? -mag : mag;
}

}  // namespace agentkv::testing
