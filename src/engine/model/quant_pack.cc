#include "engine/model/quant_pack.h"

#include <algorithm>
#include <cmath>

#include "engine/model/quant_format.h"

namespace agentkv::model {
namespace {

constexpr float kE4m3Max = 448.f;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

uint8_t F32ToE4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  // Codes 0..126 are the non-negative finite values in increasing order:
  // find the last one not above `a`, then round between it and the next.
  int lo = 0, hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (E4m3ToF32(static_cast<uint8_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo == 126) return sign | 126;  // saturate at 448
  const float below = E4m3ToF32(static_cast<uint8_t>(lo));
  const float above = E4m3ToF32(static_cast<uint8_t>(lo + 1));
  // The midpoint of two neighbours is exact in fp32 (5 significant bits).
  const float mid = (below + above) / 2;
  int code = lo;
  if (a > mid || (a == mid && lo % 2 == 1)) code = lo + 1;
  return static_cast<uint8_t>(sign | code);
}

uint8_t F32ToFp4(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float a = std::isnan(x) ? 0.f : std::fabs(x);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const float d = std::fabs(Fp4ToF32(static_cast<uint8_t>(i)) - a);
    const float bd = std::fabs(Fp4ToF32(static_cast<uint8_t>(best)) - a);
    if (d < bd || (d == bd && i % 2 == 0)) best = i;
  }
  return static_cast<uint8_t>(sign | best);
}

void PackMxfp4(const float* w, int64_t rows, int64_t cols, uint8_t* blocks, uint8_t* exponents) {
  const int64_t groups = cols / kMxfp4Block;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * cols + g * kMxfp4Block;
      float amax = 0.f;
      for (int i = 0; i < kMxfp4Block; ++i) amax = std::max(amax, std::fabs(v[i]));
      int e = 0;  // scale 2^e
      if (amax > 0.f) {
        // Smallest e with 2^e >= amax / 6: frexp gives amax / 6 = m * 2^x, m in [0.5, 1).
        int x = 0;
        const float m = std::frexp(amax / 6.f, &x);
        e = m == 0.5f ? x - 1 : x;
      }
      e = std::clamp(e, -127, 127);
      exponents[r * groups + g] = static_cast<uint8_t>(e + 127);
      const float inv = std::ldexp(1.f, -e);
      uint8_t* out = blocks + (r * cols + g * kMxfp4Block) / 2;
      for (int i = 0; i < kMxfp4Block / 2; ++i) {
        const uint8_t lo = F32ToFp4(v[2 * i] * inv), hi = F32ToFp4(v[2 * i + 1] * inv);
        out[i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

void PackFp8Block(const float* w, int64_t rows, int64_t cols, int block_rows, int block_cols,
                  uint8_t* codes, float* scale_inv) {
  const int64_t tr = CeilDiv(rows, block_rows), tc = CeilDiv(cols, block_cols);
  for (int64_t i = 0; i < tr; ++i) {
    const int64_t r0 = i * block_rows, r1 = std::min(rows, r0 + block_rows);
#pragma omp parallel for schedule(static) if ((r1 - r0) * cols > (1 << 16))
    for (int64_t j = 0; j < tc; ++j) {
      const int64_t c0 = j * block_cols, c1 = std::min(cols, c0 + block_cols);
      float amax = 0.f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = amax > 0.f ? amax / kE4m3Max : 1.f;
      scale_inv[i * tc + j] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) codes[r * cols + c] = F32ToE4m3(w[r * cols + c] / s);
    }
  }
}

void PackFp8Channel(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scales) {
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
    const float s = amax > 0.f ? amax / kE4m3Max : 1.f;
    scales[r] = s;
    for (int64_t c = 0; c < cols; ++c) codes[r * cols + c] = F32ToE4m3(w[r * cols + c] / s);
  }
}

}  // namespace agentkv::model
