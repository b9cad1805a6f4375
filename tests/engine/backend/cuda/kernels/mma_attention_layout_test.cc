// The shared-memory layout of every mma.sync attention instantiation
// (mma_attention_layout.h), on the host: no GPU needed. What the kernel
// touches must lie inside what its launch asks for, 16-byte aligned where
// cp.async, uint4 stores and ldmatrix touch it, regions must not overlap,
// the split merge must fit, and the fp8 loaders must cover their rows with
// whole passes of their threads (the static_asserts of fp8_kv_tile.cuh, as
// values a test can also check for head_dims the kernel does not have yet).
#include "engine/backend/cuda/kernels/mma_attention_layout.h"

#include <gtest/gtest.h>

#include <string>

namespace agentkv::backend::cuda {
namespace {

struct Config {
  int D, rw;
  bool fp8;
};
std::string Name(const Config& c) {
  return "D" + std::to_string(c.D) + (c.rw == 4 ? " wide" : " narrow") + (c.fp8 ? " fp8" : " bf16");
}

constexpr Config kConfigs[] = {{64, 1, false}, {64, 4, false}, {128, 1, false}, {128, 4, false},
                               {64, 1, true},  {64, 4, true},  {128, 1, true},  {128, 4, true}};

bool Aligned16(size_t x) { return x % 16 == 0; }

TEST(MmaAttentionLayout, EveryRegionIsAlignedAndInBounds) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(Name(c));
    ASSERT_TRUE(kernels::MmaLayoutInstantiated(c.D, c.rw));
    const kernels::MmaAttentionLayout l = kernels::MmaLayout(c.D, c.rw, c.fp8);
    const size_t bf = 2;
    // Rows of every bf16 tile: 16-byte cp.async / uint4 / ldmatrix rows.
    EXPECT_TRUE(Aligned16(static_cast<size_t>(l.dp) * bf));
    EXPECT_GE(l.dp, c.D);
    // Regions in order, each starting 16-byte aligned where the last ends.
    const size_t q_end = l.q_at + static_cast<size_t>(l.rows) * l.dp * bf;
    const size_t tile = static_cast<size_t>(kernels::kMmaStage) * l.dp * bf;
    const size_t k_end = l.k_at + l.kv_stages * tile;
    const size_t v_end = l.v_at + l.kv_stages * tile;
    for (size_t at : {l.q_at, l.k_at, l.v_at, l.own_at, l.staging_at}) EXPECT_TRUE(Aligned16(at));
    EXPECT_LE(q_end, l.k_at);
    EXPECT_LE(k_end, l.v_at);
    EXPECT_LE(v_end, l.own_at);
    EXPECT_LE(l.own_at + l.own_bytes, l.staging_at);
    const size_t staging_end = l.staging_at + l.fp8_stages * l.stage_bytes;
    EXPECT_LE(staging_end, l.main_bytes);
    EXPECT_LE(l.main_bytes, l.bytes);
    EXPECT_LE(l.merge_bytes, l.bytes);
    EXPECT_LE(l.bytes, kernels::kMmaMaxSmemBytes);
    // The query tile holds a block's rows; each stage's tiles its keys.
    EXPECT_EQ(l.rows, 16 * c.rw);
    EXPECT_EQ(l.key_warps * (kernels::kMmaStage / l.key_warps), kernels::kMmaStage);
    EXPECT_EQ(l.key_warps * c.rw, kernels::kMmaWarps);
    if (c.rw == 1) {
      // The narrow merge: each warp's 16 rows of D outputs and (m, l).
      EXPECT_GE(l.merge_bytes, static_cast<size_t>(kernels::kMmaWarps) * 16 * (c.D + 2) * 4);
      EXPECT_EQ(l.own_bytes, c.fp8 ? 0u : 2u * c.D * bf);  // bf16's own K and V row
    } else {
      EXPECT_EQ(l.merge_bytes, 0u);
      EXPECT_EQ(l.own_bytes, 0u);
    }
  }
}

// The fp8 staging stages: every stage, and its e4m3 rows and scales, start
// 16-byte aligned (cp.async 16 of rows, cp.async 4 and float2 reads of
// scales) and lie inside the launch, for each of the three buffers.
TEST(MmaAttentionLayout, Fp8StagesAreAlignedAndInBounds) {
  for (const Config& c : kConfigs) {
    if (!c.fp8) continue;
    SCOPED_TRACE(Name(c));
    const kernels::MmaAttentionLayout l = kernels::MmaLayout(c.D, c.rw, true);
    EXPECT_EQ(l.kv_stages, 1);
    EXPECT_EQ(l.stage_bytes, kernels::Fp8StageBytes(c.D, kernels::kMmaStage));
    EXPECT_TRUE(Aligned16(l.stage_bytes));
    const size_t ks = kernels::Fp8KeyScalesAt(c.D, kernels::kMmaStage),
                 vs = kernels::Fp8ValueScalesAt(c.D, kernels::kMmaStage);
    EXPECT_TRUE(Aligned16(ks));
    EXPECT_TRUE(Aligned16(vs));
    EXPECT_EQ(ks, 2u * kernels::kMmaStage * c.D);  // after K [keys][D] and V [keys][D] bytes
    EXPECT_EQ(vs - ks, 4u * kernels::kMmaStage);
    EXPECT_EQ(vs + 4u * kernels::kMmaStage, l.stage_bytes);
    EXPECT_GE(l.fp8_stages, 2);  // one being widened, at least one in flight
    for (int b = 0; b < l.fp8_stages; ++b) {
      const size_t at = l.staging_at + b * l.stage_bytes;
      EXPECT_TRUE(Aligned16(at)) << b;
      EXPECT_LE(at + l.stage_bytes, l.bytes) << b;
    }
    // A warp's share of a narrow stage (16 keys from row kw * 16): its rows'
    // 16-byte chunks and its scales' float2 pairs stay aligned.
    if (c.rw == 1) {
      const int kpw = kernels::kMmaStage / l.key_warps;
      for (int kw = 0; kw < l.key_warps; ++kw) {
        EXPECT_TRUE(Aligned16(static_cast<size_t>(kw) * kpw * c.D)) << kw;
        EXPECT_EQ((ks + 4u * kw * kpw) % 8, 0u) << kw;
      }
    }
  }
}

// What the launcher asks for decides whether it must raise the 48 KiB
// default first: the instantiations above it are exactly those whose
// layout says so (the bug this guards against: a tile grown past the
// attribute the launch set).
TEST(MmaAttentionLayout, BytesAboveTheDefaultNeedTheAttribute) {
  int above = 0;
  for (const Config& c : kConfigs) {
    const kernels::MmaAttentionLayout l = kernels::MmaLayout(c.D, c.rw, c.fp8);
    if (l.bytes > kernels::kDefaultSmemBytes) ++above;
    // Bigger heads never take fewer bytes.
    if (c.D == 64) {
      EXPECT_LT(l.bytes, kernels::MmaLayout(128, c.rw, c.fp8).bytes) << Name(c);
    }
  }
  EXPECT_GT(above, 0);  // head_dim 128 tiles do not fit the default
  EXPECT_GT(kernels::MmaLayout(128, 1, true).bytes, kernels::kDefaultSmemBytes);
}

// Deeper fp8 decode staging must not cost a block per SM: an sm_90 SM has
// 228 KiB of shared memory, 1 KiB of it reserved per block; decode grids of
// one long sequence (kv_heads x 32 splits, 256 blocks at 8 KV heads) fill
// 132 SMs at two blocks each.
TEST(MmaAttentionLayout, Fp8DecodeStagingKeepsBlocksPerSm) {
  auto per_sm = [](size_t bytes) { return static_cast<int>((228 * 1024) / (bytes + 1024)); };
  EXPECT_GE(per_sm(kernels::MmaLayout(64, 1, true).bytes), 3);
  EXPECT_GE(per_sm(kernels::MmaLayout(128, 1, true).bytes), 2);
  // As many as three stages (the prompt tiles' depth) would allow.
  for (int D : {64, 128}) {
    const kernels::MmaAttentionLayout l = kernels::MmaLayout(D, 1, true);
    const size_t three = l.bytes - (l.fp8_stages - 3) * l.stage_bytes;
    EXPECT_EQ(per_sm(l.bytes), per_sm(three)) << D;
  }
  EXPECT_GT(kernels::MmaLayout(64, 1, true).fp8_stages, kernels::MmaLayout(64, 4, true).fp8_stages);
}

// The lean fp8 decode form (AttentionParams::fp8_decode_lean): its layout
// keeps every rule above, and the blocks per SM it is compiled for
// (MmaMinBlocks, its registers' cap) fit the SM's shared memory too: four
// at head_dim 64, three at 128 (two staging stages: one widened, one in
// flight). Elsewhere `lean` changes nothing.
TEST(MmaAttentionLayout, LeanFp8DecodeFitsItsBlocksPerSm) {
  auto per_sm = [](size_t bytes) { return static_cast<int>((228 * 1024) / (bytes + 1024)); };
  for (int D : {64, 128}) {
    SCOPED_TRACE(D);
    const kernels::MmaAttentionLayout l = kernels::MmaLayout(D, 1, true, true);
    const int blocks = kernels::MmaMinBlocks(D, 1, true, true);
    EXPECT_EQ(blocks, D == 64 ? 4 : 3);
    EXPECT_GE(per_sm(l.bytes), blocks);
    EXPECT_GT(blocks, kernels::MmaMinBlocks(D, 1, true, false));
    // ptxas's cap: 65,536 registers an SM over blocks x 128 threads.
    EXPECT_GE(65536 / (blocks * kernels::kMmaThreads), 128);
    EXPECT_GE(l.fp8_stages, 2);
    EXPECT_EQ(l.fp8_stages, D == 64 ? 4 : 2);
    const size_t staging_end = l.staging_at + l.fp8_stages * l.stage_bytes;
    EXPECT_LE(staging_end, l.main_bytes);
    EXPECT_LE(l.merge_bytes, l.bytes);
    EXPECT_TRUE(Aligned16(l.staging_at));
    EXPECT_TRUE(Aligned16(l.stage_bytes));
    // Everything before the staging is the plain form's.
    const kernels::MmaAttentionLayout plain = kernels::MmaLayout(D, 1, true);
    EXPECT_EQ(l.staging_at, plain.staging_at);
    EXPECT_EQ(l.stage_bytes, plain.stage_bytes);
    EXPECT_LE(l.bytes, plain.bytes);
  }
  for (const Config& c : kConfigs) {
    if (c.rw == 1 && c.fp8) continue;
    const kernels::MmaAttentionLayout a = kernels::MmaLayout(c.D, c.rw, c.fp8, true),
                                      b = kernels::MmaLayout(c.D, c.rw, c.fp8);
    EXPECT_EQ(a.bytes, b.bytes) << Name(c);
    EXPECT_EQ(a.fp8_stages, b.fp8_stages) << Name(c);
    EXPECT_EQ(kernels::MmaMinBlocks(c.D, c.rw, c.fp8, true),
              kernels::MmaMinBlocks(c.D, c.rw, c.fp8))
        << Name(c);
  }
  // The one-sequence decode grid of 8 KV heads at the splits GraphShape
  // gives it (64 at head_dim 64, 49 at 128) is one wave on 132 SMs.
  EXPECT_LE(8 * 64, 132 * kernels::MmaMinBlocks(64, 1, true, true));
  EXPECT_LE(8 * 49, 132 * kernels::MmaMinBlocks(128, 1, true, true));
}

// The bf16 decode form (narrow tiles of a bf16 cache): its registers are
// ptxas's choice (MmaMinBlocks 1), so the step plan asks the driver how
// many blocks an SM holds (MmaBf16DecodeBlocksPerSm) before aiming its
// splits at one wave of them; its shared memory alone allows five at
// head_dim 64 and three at 128, so registers are what may bind.
TEST(MmaAttentionLayout, Bf16DecodeSharedMemoryLeavesTheFitToRegisters) {
  auto per_sm = [](size_t bytes) { return static_cast<int>((228 * 1024) / (bytes + 1024)); };
  EXPECT_EQ(kernels::MmaMinBlocks(64, 1, false), 1);
  EXPECT_EQ(kernels::MmaMinBlocks(128, 1, false), 1);
  EXPECT_GE(per_sm(kernels::MmaLayout(64, 1, false).bytes), 5);
  EXPECT_GE(per_sm(kernels::MmaLayout(128, 1, false).bytes), 3);
  // (The one-sequence grid of 8 KV heads at 64 splits is one wave of four
  // blocks an SM on 132 SMs, of three at 49.)
  EXPECT_LE(8 * 64, 132 * 4);
  EXPECT_LE(8 * 49, 132 * 3);
}

// The fp8 loaders' thread coverage: the block over a whole stage (wide
// tiles) and one warp over its 16 keys (narrow tiles), for the head_dims
// the kernel has; and what it must refuse (a row not a whole number of
// 16-byte chunks, lanes that do not divide the rows).
TEST(MmaAttentionLayout, Fp8LoadersCoverTheirRows) {
  for (int D : {64, 128}) {
    SCOPED_TRACE(D);
    EXPECT_TRUE(kernels::Fp8IssueCovers(D, kernels::kMmaStage, kernels::kMmaThreads));
    EXPECT_TRUE(kernels::Fp8ConvertCovers(D, kernels::kMmaStage, kernels::kMmaThreads));
    const int kpw = kernels::kMmaStage / kernels::kMmaWarps;
    EXPECT_TRUE(kernels::Fp8IssueCovers(D, kpw, 32));
    EXPECT_TRUE(kernels::Fp8ConvertCovers(D, kpw, 32));
  }
  EXPECT_FALSE(kernels::Fp8IssueCovers(72, 16, 32));    // 4.5 chunks a row
  EXPECT_FALSE(kernels::Fp8IssueCovers(64, 12, 32));    // 8 rows a pass into 12
  EXPECT_FALSE(kernels::Fp8IssueCovers(1024, 16, 32));  // 64 chunks a row, 32 lanes
  EXPECT_FALSE(kernels::Fp8ConvertCovers(64, 3, 32));   // 24 groups for 32 lanes
}

}  // namespace
}  // namespace agentkv::backend::cuda
