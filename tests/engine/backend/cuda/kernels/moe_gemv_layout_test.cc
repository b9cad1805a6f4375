// The quantized GEMV's fragment layout (moe_gemv_layout.h) on the host: no
// GPU and no CUDA toolkit needed. The e2m1 -> e4m3 rewriting against the
// CPU decoders (engine/model/quant_format.h) for every nibble in every
// position; the A fragment's slots against the staged x positions the B
// fragment reads.
#include "engine/backend/cuda/kernels/moe_gemv_layout.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/model/quant_format.h"

namespace agentkv::backend::cuda::kernels {
namespace {

// The e4m3 byte of slot j (0..3) of a step's two pairs.
uint8_t SlotByte(const uint32_t (&pair)[2], int j) {
  return static_cast<uint8_t>((pair[j / 2] >> (8 * (j % 2))) & 0xffu);
}

// Every word of 8 nibbles (each nibble value in each position, the rest
// random): each slot's e4m3 byte is its value's e2m1 times 2^-6 exactly,
// never an e4m3 NaN.
TEST(MoeGemvLayout, Mxfp4StepPairsHoldTheSlotValues) {
  std::mt19937 rng(3);
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t nib = 0; nib < 16; ++nib)
      for (int rep = 0; rep < 8; ++rep) {
        uint32_t u = static_cast<uint32_t>(rng());
        u = (u & ~(0xfu << (4 * pos))) | (nib << (4 * pos));
        for (int s = 0; s < 2; ++s) {
          uint32_t pair[2];
          MoeMxfp4StepPairs(u, s, pair);
          EXPECT_EQ(pair[0] >> 16, 0u);
          EXPECT_EQ(pair[1] >> 16, 0u);
          for (int j = 0; j < 4; ++j) {
            // Lane 0: the word's value i is the block's value i.
            const int v = MoeMxfp4SlotValue(0, s, j);
            const uint8_t code = SlotByte(pair, j);
            EXPECT_NE(code & 0x7f, 0x7f);
            const float want = model::Fp4ToF32(static_cast<uint8_t>((u >> (4 * v)) & 0xfu));
            EXPECT_EQ(model::E4m3ToF32(code) * 64.f, want)
                << "word " << std::hex << u << std::dec << " step " << s << " slot " << j;
          }
        }
      }
}

// The A slots of lane t at step s take the values the B fragment finds at
// 16s + 4t .. + 3 of the staged block, in slot order; every value of a
// block is taken exactly once, and staging is a permutation within blocks.
TEST(MoeGemvLayout, Mxfp4SlotsMatchTheStagedX) {
  for (int block = 0; block < 3; ++block) {
    std::vector<int> taken(32, 0), staged(32, 0);
    for (int t = 0; t < 4; ++t)
      for (int s = 0; s < 2; ++s)
        for (int j = 0; j < 4; ++j) {
          const int v = MoeMxfp4SlotValue(t, s, j);
          ASSERT_GE(v, 0);
          ASSERT_LT(v, 32);
          ++taken[v];
          EXPECT_EQ(MoeMxfp4StagePos(32 * block + v), 32 * block + 16 * s + 4 * t + j)
              << "t " << t << " s " << s << " j " << j;
        }
    for (int v = 0; v < 32; ++v) {
      EXPECT_EQ(taken[v], 1) << v;
      const int at = MoeMxfp4StagePos(32 * block + v) - 32 * block;
      ASSERT_GE(at, 0);
      ASSERT_LT(at, 32);
      ++staged[at];
    }
    for (int v = 0; v < 32; ++v) EXPECT_EQ(staged[v], 1) << v;
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels
