// TpReducePlan: which all-reduces run from the symmetric window (by size:
// small ones), the layout of a rank's window, the placement of the
// all-reduced buffers' views in it (inside the window, on NCCL's
// alignment, never overlapping, all or nothing), and which NCCL versions
// need a fence before an all-reduce from the window.
#include "engine/backend/tp_reduce_plan.h"

#include <gtest/gtest.h>

#include "../test_model.h"

namespace agentkv::backend {
namespace {

using agentkv::testing::SmallConfig;

// Hidden 48: a token's residual row is 192 bytes.
model::ModelConfig Dense() { return SmallConfig(model::Architecture::kQwen3); }
model::ModelConfig Sandwich() { return SmallConfig(model::Architecture::kGemma3); }

// Small all-reduces from the window, large ones from plain buffers, the
// bound included; nothing is an empty all-reduce.
TEST(TpReducePlanTest, SmallReducesFromTheWindowLargeFromPlainBuffers) {
  EXPECT_EQ(kTpWindowReduceMaxBytes, size_t{16} << 10);
  EXPECT_FALSE(TpReduceFromWindow(0));
  EXPECT_TRUE(TpReduceFromWindow(4));
  EXPECT_TRUE(TpReduceFromWindow(8 << 10));   // measured: the window leads
  EXPECT_TRUE(TpReduceFromWindow(16 << 10));  // measured: the window leads
  EXPECT_TRUE(TpReduceFromWindow(kTpWindowReduceMaxBytes));
  EXPECT_FALSE(TpReduceFromWindow(32 << 10));  // measured: the window trails
  EXPECT_FALSE(TpReduceFromWindow(kTpWindowReduceMaxBytes + 1));
  EXPECT_FALSE(TpReduceFromWindow(64 << 10));  // measured: the window trails
  EXPECT_FALSE(TpReduceFromWindow(size_t{1} << 20));
}

// Tokens per step whose fp32 residual stays within the bound: decode steps
// of few sequences of real shapes, none where one row is already larger.
TEST(TpReducePlanTest, WindowTokensFollowTheHiddenSize) {
  model::ModelConfig c = Dense();  // 192 bytes a row
  EXPECT_EQ(TpWindowTokens(c), 85);
  EXPECT_TRUE(TpReduceFromWindow(85 * 192));
  EXPECT_FALSE(TpReduceFromWindow(86 * 192));
  c.hidden_size = 2048;  // Llama-3.2-1B: 8 KiB a token
  EXPECT_EQ(TpWindowTokens(c), 2);
  c.hidden_size = 4096;  // Qwen3-8B, Llama-3.1-8B: 16 KiB a token
  EXPECT_EQ(TpWindowTokens(c), 1);
  c.hidden_size = 4097;
  EXPECT_EQ(TpWindowTokens(c), 0);
  c.hidden_size = 8192;  // Llama-3.1-70B: 32 KiB, never from the window
  EXPECT_EQ(TpWindowTokens(c), 0);
  // Every step up to the bound's tokens is one TpReduceFromWindow takes,
  // and the next is not.
  for (int hidden : {48, 1024, 2048, 2880, 4096}) {
    c.hidden_size = hidden;
    const int64_t t = TpWindowTokens(c);
    const size_t row = static_cast<size_t>(hidden) * 4;
    EXPECT_TRUE(TpReduceFromWindow(static_cast<size_t>(t) * row)) << hidden;
    EXPECT_FALSE(TpReduceFromWindow(static_cast<size_t>(t + 1) * row)) << hidden;
  }
}

// A step sums from the window when its all-reduces are small enough and
// the views hold its rows; an empty step or no views never.
TEST(TpReducePlanTest, StepsFromTheWindowWhenSmallAndHeld) {
  model::ModelConfig c = Dense();  // up to 85 tokens by size
  EXPECT_TRUE(TpStepFromWindow(c, 1, 176));
  EXPECT_TRUE(TpStepFromWindow(c, 85, 176));
  EXPECT_FALSE(TpStepFromWindow(c, 86, 176));  // too large a sum
  EXPECT_FALSE(TpStepFromWindow(c, 65, 64));   // views too short
  EXPECT_TRUE(TpStepFromWindow(c, 64, 64));
  EXPECT_FALSE(TpStepFromWindow(c, 1, 0));  // no views
  EXPECT_FALSE(TpStepFromWindow(c, 0, 176));
  c.hidden_size = 4096;  // an 8B model: decode of one sequence
  EXPECT_TRUE(TpStepFromWindow(c, 1, 8));
  EXPECT_FALSE(TpStepFromWindow(c, 2, 8));
  c.hidden_size = 4097;  // even one token's sum too large
  EXPECT_FALSE(TpStepFromWindow(c, 1, 8));
}

// The residual stream, and a sandwich-norm model's o output after it, on
// NCCL's 4096-byte alignment.
TEST(TpReducePlanTest, ArenaHoldsTheSummedBuffersAligned) {
  const model::ModelConfig c = Dense();
  TpReduceArena a = TpReduceArenaFor(c, 64);  // 12,288 bytes
  EXPECT_EQ(a.residual_bytes, 64u * 48 * 4);
  EXPECT_EQ(a.attn_out, 0u);
  EXPECT_EQ(a.bytes, 12288u);
  a = TpReduceArenaFor(c, 65);  // 12,480: a fourth page
  EXPECT_EQ(a.bytes, 16384u);
  const model::ModelConfig g = Sandwich();
  a = TpReduceArenaFor(g, 65);
  EXPECT_EQ(a.attn_out, 16384u);
  EXPECT_EQ(a.bytes, 32768u);
  EXPECT_EQ(a.attn_out % kTpWindowAlign, 0u);
  EXPECT_GE(TpReduceArenaFor(c, 0).bytes, kTpWindowAlign);  // never empty
}

TEST(TpReducePlanTest, BuffersGoInTheWindowWhenItsLayoutFits) {
  const model::ModelConfig c = Dense();
  TpReducePlacement p = PlaceTpReduce(c, 64, 12288);
  EXPECT_EQ(p.buffer_bytes, 12288u);
  EXPECT_TRUE(p.x_in_window);
  EXPECT_EQ(p.x_offset, 0u);
  EXPECT_FALSE(p.o_in_window);  // a dense model never sums o apart
  // A larger window holds it too; a smaller one (or none) holds nothing.
  EXPECT_TRUE(PlaceTpReduce(c, 64, 1 << 20).x_in_window);
  EXPECT_FALSE(PlaceTpReduce(c, 64, 12287).x_in_window);
  EXPECT_FALSE(PlaceTpReduce(c, 64, 0).x_in_window);
  // A capacity past the window's (a step beyond Reserve's limits).
  p = PlaceTpReduce(c, 65, 12288);
  EXPECT_FALSE(p.x_in_window);
  EXPECT_EQ(p.buffer_bytes, 65u * 48 * 4);

  const model::ModelConfig g = Sandwich();
  p = PlaceTpReduce(g, 64, 24576);
  EXPECT_TRUE(p.x_in_window);
  EXPECT_TRUE(p.o_in_window);
  EXPECT_EQ(p.x_offset, 0u);
  EXPECT_EQ(p.o_offset, 12288u);
  // Room for x but not for o: neither (NCCL sees every summed buffer in a
  // window or none).
  p = PlaceTpReduce(g, 64, 12288);
  EXPECT_FALSE(p.x_in_window);
  EXPECT_FALSE(p.o_in_window);
}

// Over capacities and window sizes: whatever is placed lies inside the
// window, on NCCL's alignment, and x and o never share a byte.
TEST(TpReducePlanTest, PlacedBuffersNeverOverlapAndStayInsideTheWindow) {
  for (const model::ModelConfig& c : {Dense(), Sandwich()}) {
    for (int64_t tokens : {1, 2, 7, 21, 64, 65, 256, 1000}) {
      for (size_t window : {size_t{0}, size_t{4096}, size_t{8192}, size_t{12288}, size_t{16384},
                            size_t{65536}, size_t{1} << 20, size_t{3} << 20}) {
        const TpReducePlacement p = PlaceTpReduce(c, tokens, window);
        SCOPED_TRACE(::testing::Message() << "sandwich " << c.sandwich_norm << " tokens " << tokens
                                          << " window " << window);
        EXPECT_EQ(p.buffer_bytes, static_cast<size_t>(tokens) * c.hidden_size * 4);
        EXPECT_EQ(p.x_in_window, TpReduceArenaFor(c, tokens).bytes <= window && window > 0);
        EXPECT_EQ(p.o_in_window, p.x_in_window && c.sandwich_norm);
        if (p.x_in_window) {
          EXPECT_EQ(p.x_offset % kTpWindowAlign, 0u);
          EXPECT_LE(p.x_offset + p.buffer_bytes, window);
        }
        if (p.o_in_window) {
          EXPECT_EQ(p.o_offset % kTpWindowAlign, 0u);
          EXPECT_LE(p.o_offset + p.buffer_bytes, window);
          EXPECT_TRUE(p.x_offset + p.buffer_bytes <= p.o_offset ||
                      p.o_offset + p.buffer_bytes <= p.x_offset);
        }
      }
    }
  }
}

// NCCL 2.28.x (the lent machines' 2.28.9 among them) launches its
// symmetric kernels as programmatic dependents without their wait: an
// all-reduce from a window needs the fence there, on Hopper and later.
TEST(TpReducePlanTest, SymmetricKernelsWithoutTheirWaitNeedTheFence) {
  EXPECT_EQ(NcclVersionCode(2, 28, 9), 22809);
  EXPECT_TRUE(TpWindowReduceNeedsFence(NcclVersionCode(2, 28, 9), 9));
  EXPECT_TRUE(TpWindowReduceNeedsFence(NcclVersionCode(2, 28, 0), 9));
  EXPECT_TRUE(TpWindowReduceNeedsFence(NcclVersionCode(2, 29, 3), 9));
  EXPECT_TRUE(TpWindowReduceNeedsFence(NcclVersionCode(2, 30, 6), 10));
  // 2.27 waited; 2.30.7 waits again.
  EXPECT_FALSE(TpWindowReduceNeedsFence(NcclVersionCode(2, 27, 7), 9));
  EXPECT_FALSE(TpWindowReduceNeedsFence(NcclVersionCode(2, 30, 7), 9));
  EXPECT_FALSE(TpWindowReduceNeedsFence(NcclVersionCode(2, 31, 2), 9));
  // Before compute capability 9.0 nothing launches programmatically.
  EXPECT_FALSE(TpWindowReduceNeedsFence(NcclVersionCode(2, 28, 9), 8));
}

}  // namespace
}  // namespace agentkv::backend
