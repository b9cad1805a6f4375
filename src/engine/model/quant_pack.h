// Packers: fp32 weights into the stored formats of engine/model/quant_format.h,
// as published checkpoints hold them (used by `agentkv model synth --quant`
// and by tests). Pure functions; thread-safe.
#pragma once

#include <cstdint>

namespace agentkv::model {

// fp32 to e4m3fn: round to nearest, ties to even, saturating at +-448;
// NaN becomes 0x7F.
uint8_t F32ToE4m3(float x);
// fp32 to the nearest e2m1 nibble (ties to the even code), saturating at +-6.
uint8_t F32ToFp4(float x);

// MXFP4: `w` is rows x cols (cols a multiple of 32), row-major. Per 32
// values of a row the scale is amax / 6 rounded up to a power of two (2^0
// for all-zero groups), stored as its E8M0 exponent (clamped to [0, 254]);
// each value becomes the nearest e2m1 of value / scale. `blocks` receives
// rows * cols / 2 bytes (low nibble first), `exponents` rows * cols / 32.
void PackMxfp4(const float* w, int64_t rows, int64_t cols, uint8_t* blocks, uint8_t* exponents);

// FP8 with one scale per block_rows x block_cols tile (edge tiles ragged):
// scale_inv = amax / 448 of the tile (1 for an all-zero tile), codes =
// e4m3(w / scale_inv). `codes` receives rows * cols bytes, `scale_inv`
// ceil(rows / block_rows) * ceil(cols / block_cols) floats.
void PackFp8Block(const float* w, int64_t rows, int64_t cols, int block_rows, int block_cols,
                  uint8_t* codes, float* scale_inv);

// FP8 with one scale per row (output channel): scale = amax / 448 of the row
// (1 for an all-zero row). `scales` receives `rows` floats.
void PackFp8Channel(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scales);

}  // namespace agentkv::model
