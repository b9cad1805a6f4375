// The FP8 (e4m3) KV cache format, shared by the backends (docs/kv-fp8.md).
//
// Every (token, KV head) row of K and of V is quantized on its own: its
// scale is amax / 448 over the row's head_dim values (448: e4m3's largest
// finite value), stored as an f32 beside the row's bytes, and an element
// x is stored as e4m3(x * (448 / amax)) (round to nearest even, saturating
// at +-448). A row of zeros has scale 0 and bytes 0. Reading is
// e4m3_value * scale in f32. Why per row: synthesized and real models have
// K/V magnitudes from ~1e-3 to ~1e2 and a fixed scale either saturates or
// underflows some of them; with one scale per row every row keeps e4m3's
// full 3-bit mantissa, and an attention kernel needs the scale only once
// per key (it factors out of q . k and into the softmax weight of v).
//
// Block layout (a fixed number of bytes, so the store, the prefix cache and
// block copies keep treating blocks as opaque bytes): for each layer of the
// group, K then V, each a section of
//   [block_size][kv_heads][head_dim] e4m3 bytes, then
//   [block_size][kv_heads] f32 scales,
// i.e. block_size * kv_heads * (head_dim + 4) bytes a section.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define AGENTKV_KV_FP8_HD __host__ __device__
#else
#define AGENTKV_KV_FP8_HD
#endif

namespace agentkv::backend::kvfp8 {

inline constexpr float kMax = 448.f;       // largest finite e4m3 value
inline constexpr uint8_t kMaxCode = 0x7e;  // +448
inline constexpr uint8_t kNaN = 0x7f;

// Bytes of one section (K or V of one layer) of a block.
AGENTKV_KV_FP8_HD inline int64_t SectionBytes(int block_size, int kv_heads, int head_dim) {
  return static_cast<int64_t>(block_size) * kv_heads * (head_dim + 4);
}
// Offset of the scales within a section.
AGENTKV_KV_FP8_HD inline int64_t ScalesOffset(int block_size, int kv_heads, int head_dim) {
  return static_cast<int64_t>(block_size) * kv_heads * head_dim;
}

// e4m3 bits -> float (exact). NaN for 0x7f / 0xff.
inline float Decode(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + m), e - 10);
  }
  return (b & 0x80) ? -v : v;
}

// float -> e4m3 bits: round to nearest even, saturating to +-448 (also
// infinities); NaN -> 0x7f. As the GPU's cvt.rn.satfinite.e4m3 does.
inline uint8_t Encode(float x) {
  if (std::isnan(x)) return kNaN;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= kMax) return sign | kMaxCode;
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (exact scaling)
    const int q = static_cast<int>(std::nearbyint(a * 512.f));  // 0..8; 8 = 2^-6 = code 8
    return sign | static_cast<uint8_t>(q);
  }
  int e2;
  const float r = std::frexp(a, &e2);  // a = r * 2^e2, r in [0.5, 1)
  int e = e2 - 1;                      // a = (2r) * 2^e, 2r in [1, 2)
  // (2r - 1) * 8 is exact in float; nearbyint rounds half to even.
  int m = static_cast<int>(std::nearbyint((2.f * r - 1.f) * 8.f));
  if (m == 8) {
    m = 0;
    ++e;
  }
  const int code = ((e + 7) << 3) | m;
  return sign | static_cast<uint8_t>(code > kMaxCode ? kMaxCode : code);
}

// Quantizes one row of n floats: bytes to `out`, returns its scale.
inline float QuantizeRow(const float* x, int n, uint8_t* out) {
  float amax = 0.f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float scale = amax / kMax;
  const float inv = amax > 0.f ? kMax / amax : 0.f;
  for (int i = 0; i < n; ++i) out[i] = Encode(x[i] * inv);
  return scale;
}

// Decode of every byte (built once, thread-safe).
inline const float* DecodeTable() {
  static const struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = Decode(static_cast<uint8_t>(i));
    }
  } table;
  return table.v;
}

// out[i] = Decode(in[i]) * scale.
inline void DequantizeRow(const uint8_t* in, float scale, int n, float* out) {
  const float* t = DecodeTable();
  for (int i = 0; i < n; ++i) out[i] = t[in[i]] * scale;
}

}  // namespace agentkv::backend::kvfp8
