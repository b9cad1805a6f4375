// Scalar conversions between fp32 and the 16-bit float formats weights and
// KV caches use. Float -> 16-bit conversions round to nearest, ties to even;
// NaN stays NaN (quiet), infinities and signed zeros are preserved, and
// values beyond the fp16 range become infinity. Pure functions, thread-safe.
#pragma once

#include <bit>
#include <cstdint>

namespace agentkv {

inline float Bf16ToF32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t F32ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds half-way cases to even.
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

inline float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal: renormalise so the leading 1 sits at bit 10.
    int shift = 0;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      ++shift;
    }
    man &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t F32ToF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  int exp = static_cast<int>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal half: keep 10 mantissa bits, round the 13 dropped ones.
    uint32_t half = ((static_cast<uint32_t>(exp + 15) << 10) | ((abs >> 13) & 0x3ffu));
    uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // carry may bump exp
    return sign | static_cast<uint16_t>(half);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal
  // Subnormal half: value = man * 2^-24 with the implicit bit made explicit.
  uint32_t man = (abs & 0x7fffffu) | 0x800000u;
  // f = man * 2^(exp - 23) = (man >> drop) units of 2^-24, drop = -exp - 1.
  int drop = -exp - 1;
  uint32_t q = man >> drop;
  uint32_t rem = man & ((1u << drop) - 1);
  uint32_t halfway = 1u << (drop - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

}  // namespace agentkv
