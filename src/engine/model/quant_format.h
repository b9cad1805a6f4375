// Quantized weight formats of published checkpoints, and their decoding.
//
//   MXFP4 (GPT-OSS experts): `*_blocks` U8 [.., out, in/32, 16] and `*_scales`
//     U8 [.., out, in/32]. Each byte holds two e2m1 values, the low nibble
//     first (the lower input index); value = LUT[nibble] * 2^(scale - 127)
//     with LUT 0, .5, 1, 1.5, 2, 3, 4, 6, negated for nibbles 8-15.
//   FP8 block (Qwen3-*-FP8, DeepSeek): `weight` F8_E4M3 [out, in] and
//     `weight_scale_inv` [ceil(out/br), ceil(in/bc)] (F32 or BF16); W = W8 *
//     scale_inv of the tile holding the element; edge tiles may be ragged.
//   FP8 per channel / per tensor (compressed-tensors): `weight` F8_E4M3 and
//     `weight_scale` [out, 1] (or [out]) / a single value; W = W8 * scale.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace agentkv::model {

enum class QuantFormat { kMxfp4, kFp8Block, kFp8Channel, kFp8Tensor };

std::string_view QuantFormatName(QuantFormat f);  // "mxfp4", "fp8-block", ...

// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
// codes 0x7F and 0xFF are NaN; exponent 0 is subnormal (m/8 * 2^-6); the
// largest finite value is 448.
float E4m3ToF32(uint8_t code);
// The e2m1 value of the low 4 bits of `nibble` (bit 3 is the sign).
float Fp4ToF32(uint8_t nibble);
// An E8M0 scale: 2^(e - 127); e = 255 is NaN (OCP MX).
float E8m0ToF32(uint8_t e);

inline constexpr int kMxfp4Block = 32;  // values per scale, along the input dimension

// One linear weight as stored, kept quantized: `batch` matrices (experts; 1
// for a dense layer) of rows (output features) x cols (input features).
struct QuantizedWeight {
  QuantFormat format = QuantFormat::kFp8Block;
  std::vector<int64_t> shape;  // logical [.., out, in]
  int64_t batch = 1, rows = 0, cols = 0;
  // fp8: one e4m3 code per element, [batch][rows][cols]. mxfp4: the blocks,
  // [batch][rows][cols / 32][16] bytes.
  std::vector<uint8_t> codes;
  std::vector<uint8_t> exponents;  // mxfp4: [batch][rows][cols / 32] E8M0 scales
  // fp8 block: [batch][ceil(rows / block_rows)][ceil(cols / block_cols)];
  // channel: [batch][rows]; tensor: [batch].
  std::vector<float> scales;
  int block_rows = 0, block_cols = 0;  // fp8 block only

  // The bytes this weight holds in memory (codes, exponents and scales).
  uint64_t bytes() const;
  // InvalidArgument unless the sizes agree with the format and the shape.
  Status Validate() const;
};

// Dequantizes rows [r0, r1) of matrix `b` into `out`, (r1 - r0) x cols
// floats, row-major. Requires a valid weight and 0 <= r0 <= r1 <= rows.
void DequantizeRows(const QuantizedWeight& w, int64_t b, int64_t r0, int64_t r1, float* out);

}  // namespace agentkv::model
