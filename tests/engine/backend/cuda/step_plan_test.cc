// The CUDA backend's step plan (step_plan.h): sizes, shapes, attention
// routes and the metadata a step uploads, on the host (no GPU, no CUDA
// toolkit needed).
#include "engine/backend/cuda/step_plan.h"

#include "engine/backend/cuda/kernels/kv_route.h"

#include <gtest/gtest.h>

#include <vector>

namespace agentkv::backend::cuda {
namespace {

// One full-attention layer, and with `sliding` a second layer of a
// 32-token window (its own group, a ring).
cache::ModelCacheSpec Spec(bool sliding) {
  cache::ModelCacheSpec s;
  s.num_layers = sliding ? 2 : 1;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.kv_dtype = cache::KvDtype::kBF16;
  s.layer_kinds = {cache::AttentionKind::kFull};
  s.layer_windows = {0};
  if (sliding) {
    s.layer_kinds.push_back(cache::AttentionKind::kSliding);
    s.layer_windows.push_back(32);
  }
  s.BuildGroups();
  return s;
}

StepModel Model() {
  StepModel m;
  m.num_kv_heads = 2;
  m.wide_supported = true;
  m.narrow_tile_tokens = 4;  // 16 rows, 4 query heads per KV head
  m.wide_tile_tokens = 16;
  m.fused_rotary_supported = true;
  m.num_sms = 132;
  m.kv_map_ok.fill(true);
  return m;
}

// A batch whose steps own their tokens and tables.
struct Batch {
  std::vector<std::vector<int32_t>> tokens, tables;
  std::vector<SeqStep> steps;
  void Add(int n, int start, bool logits, int prev_row = -1) {
    tokens.emplace_back();
    for (int i = 0; i < n; ++i) tokens.back().push_back(100 * static_cast<int>(steps.size()) + i);
    const int blocks = (start + n + 15) / 16;
    tables.emplace_back();
    for (int b = 0; b < blocks; ++b)
      tables.back().push_back(10 * static_cast<int>(steps.size()) + b);
    SeqStep st;
    st.start_pos = start;
    st.want_logits = logits;
    st.prev_row = prev_row;
    steps.push_back(st);
  }
  // Spans into the vectors, once they no longer move.
  std::span<const SeqStep> Done(int groups = 1) {
    for (size_t i = 0; i < steps.size(); ++i) {
      steps[i].tokens = tokens[i];
      for (int g = 0; g < groups; ++g) steps[i].block_tables[g] = tables[i];
    }
    return steps;
  }
};

// `seqs` sequences decoding one token each at position `start`, each
// wanting logits.
Batch Decoding(int seqs, int start) {
  Batch b;
  for (int s = 0; s < seqs; ++s) b.Add(1, start, true);
  return b;
}

// n rows, every one picked greedily on the device.
std::vector<RowPick> Greedy(int n) {
  std::vector<RowPick> rows(n);
  for (RowPick& r : rows) r.mode = PickMode::kGreedy;
  return rows;
}

// A plan of one cache group built for partials of 4,096 rows and block
// tables `width` ints wide, and the metadata it writes (WriteStepMeta over
// ints first set to -7) for the batch it was sized from.
struct Written {
  StepPlan plan;
  std::vector<int32_t> meta;
};
Written Write(const Batch& b, const StepSizes& z, const cache::ModelCacheSpec& spec, int width,
              PrevPicks prev = {}) {
  StepCapacity cap;
  cap.parts = 4096;
  cap.width = {width, 0, 0, 0};
  Written w;
  w.plan = BuildStepPlan(z, spec, 16, Model(), cap);
  w.meta.assign(w.plan.layout.total, -7);
  std::vector<std::array<int, 4>> scratch;
  WriteStepMeta(b.steps, w.plan, 1, prev, w.meta, &scratch);
  return w;
}

TEST(StepPlan, BucketsAndStrides) {
  EXPECT_EQ(DecodeBucket(1), 1);
  EXPECT_EQ(DecodeBucket(3), 4);
  EXPECT_EQ(DecodeBucket(17), 24);
  EXPECT_EQ(DecodeBucket(256), 256);
  EXPECT_EQ(DecodeBucket(257), 320);
  EXPECT_EQ(Pow2AtLeast(0), 16);
  EXPECT_EQ(Pow2AtLeast(16), 16);
  EXPECT_EQ(Pow2AtLeast(17), 32);
  EXPECT_EQ(Pow2AtLeast(1000), 1024);
}

TEST(StepPlan, PureDecodeRunsAsAPaddedGraph) {
  Batch b;
  for (int s = 0; s < 3; ++s) b.Add(1, 40 + s, true);
  const cache::ModelCacheSpec spec = Spec(false);
  const StepSizes z = SizeStep(b.Done(), {}, spec, 16, Model());
  EXPECT_TRUE(z.decode);
  EXPECT_TRUE(z.graph);
  EXPECT_FALSE(z.wide);
  EXPECT_EQ(z.tokens, 3);
  EXPECT_EQ(z.rows, 3);
  EXPECT_EQ(z.padded, 4);
  EXPECT_EQ(z.workspace_tokens(), 4);
  EXPECT_EQ(z.tiles, 3);
  EXPECT_EQ(z.need_blocks, 3);  // 43 tokens in blocks of 16
  EXPECT_EQ(z.stride, 16);
  // No rows given: every row's logits go to the host.
  EXPECT_TRUE(z.any_logits);
  EXPECT_FALSE(z.any_greedy);

  StepModel off = Model();
  off.graphs = false;
  const StepSizes plain = SizeStep(b.Done(), {}, spec, 16, off);
  EXPECT_FALSE(plain.graph);
  EXPECT_EQ(plain.padded, 3);
  EXPECT_EQ(plain.workspace_tokens(), 3);
}

TEST(StepPlan, MixedPrefillAndDecodeTakeWideTiles) {
  Batch b;
  b.Add(37, 0, true);    // a prompt chunk: 3 wide tiles of 16
  b.Add(1, 90, true);    // a decoding sequence
  b.Add(16, 16, false);  // a chunk that samples nothing
  const cache::ModelCacheSpec spec = Spec(false);
  const StepSizes z = SizeStep(b.Done(), {}, spec, 16, Model());
  EXPECT_FALSE(z.decode);
  EXPECT_FALSE(z.graph);
  EXPECT_TRUE(z.wide);
  EXPECT_EQ(z.tokens_per_tile, 16);
  EXPECT_EQ(z.tiles, 3 + 1 + 1);
  EXPECT_EQ(z.tokens, 54);
  EXPECT_EQ(z.rows, 2);
  EXPECT_EQ(z.padded, 3);
  EXPECT_EQ(z.need_blocks, 6);  // 91 tokens
  // Where the head_dim has no wide tiles, prompt steps stay narrow.
  StepModel narrow = Model();
  narrow.wide_supported = false;
  const StepSizes n = SizeStep(b.Done(), {}, spec, 16, narrow);
  EXPECT_FALSE(n.wide);
  EXPECT_EQ(n.tokens_per_tile, 4);
  EXPECT_EQ(n.tiles, 10 + 1 + 4);
  // One decode row without logits is not a decode step either.
  Batch d;
  d.Add(1, 5, true);
  d.Add(1, 5, false);
  EXPECT_FALSE(SizeStep(d.Done(), {}, spec, 16, Model()).decode);
}

TEST(StepPlan, PickModesOfTheRows) {
  Batch b = Decoding(3, 3);
  const cache::ModelCacheSpec spec = Spec(false);
  std::vector<RowPick> rows = Greedy(2);
  // Row 2 is past `rows`: kHost.
  EXPECT_EQ(RowMode(rows, 2), PickMode::kHost);
  StepSizes z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_TRUE(z.any_greedy);
  EXPECT_TRUE(z.any_logits);
  EXPECT_FALSE(z.any_draw);
  rows.push_back(RowPick{});
  rows[2].mode = PickMode::kDevice;
  z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_FALSE(z.any_logits);
  EXPECT_TRUE(z.any_draw);
  for (RowPick& r : rows) r.mode = PickMode::kGreedy;
  z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_TRUE(z.any_greedy);
  EXPECT_FALSE(z.any_logits || z.any_draw || z.any_logprobs);
  // A device-picked row asking for logprobs; a host row's request is not
  // the device's.
  rows[1].logprobs = 0;
  z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_TRUE(z.any_logprobs);
  EXPECT_FALSE(z.any_logits || z.any_draw);
  rows[1].mode = PickMode::kHost;
  z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_FALSE(z.any_logprobs);
}

// Greedy rows asking for logprobs need the logits stored (the argmax in
// the LM head's epilogue stores none otherwise).
TEST(StepPlan, LogprobRowsStoreTheLogits) {
  Batch b = Decoding(3, 5);
  const cache::ModelCacheSpec spec = Spec(false);
  std::vector<RowPick> rows = Greedy(3);
  rows[2].logprobs = 5;
  const StepSizes z = SizeStep(b.Done(), rows, spec, 16, Model());
  const Written w = Write(b, z, spec, 32);
  EXPECT_EQ(w.meta[w.plan.layout.store_logits], 1);
}

// Device-picked rows that keep their logits (an optimistic pick of a
// constrained row, read back when the grammar rejects it) need them stored
// too; a host row's keep_logits is no device row's.
TEST(StepPlan, KeptRowsStoreTheLogits) {
  Batch b = Decoding(3, 5);
  const cache::ModelCacheSpec spec = Spec(false);
  std::vector<RowPick> rows = Greedy(3);
  StepSizes z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_FALSE(z.any_keep);
  rows[1].keep_logits = 1;
  z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_TRUE(z.any_keep);
  EXPECT_FALSE(z.any_logits || z.any_draw || z.any_logprobs);
  ASSERT_TRUE(z.graph);  // still a graph step: the flag is in the metadata
  const Written w = Write(b, z, spec, 32);
  EXPECT_EQ(w.meta[w.plan.layout.store_logits], 1);
  rows[1].mode = PickMode::kHost;
  rows[0].mode = PickMode::kHost;
  rows[2].mode = PickMode::kHost;
  z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_FALSE(z.any_keep);
}

TEST(StepPlan, SlidingRingsDoNotWidenTheTables) {
  // Full group: 300 tokens need 19 blocks; the ring of the sliding group
  // (window 32) needs at most 3, so the full group sets the stride.
  Batch b;
  b.Add(1, 299, true);
  const cache::ModelCacheSpec spec = Spec(true);
  ASSERT_EQ(spec.groups.size(), 2u);
  ASSERT_GT(spec.RingBlocks(1, 16), 0);
  const StepSizes z = SizeStep(b.Done(2), {}, spec, 16, Model());
  EXPECT_EQ(z.need_blocks, 19);
  EXPECT_EQ(z.stride, 32);
}

TEST(StepPlan, SplitsFillTheGpuAndRespectThePartials) {
  const StepModel m = Model();  // 132 SMs, 2 KV heads
  // Decode, 4 tiles of short context: a block per SM (132 / 8 -> 17).
  EXPECT_EQ(AttentionSplits(4, 4, 256, m, 1 << 20), 17);
  // Long context: one split per 256 keys, at most 32.
  EXPECT_EQ(AttentionSplits(64, 64, 20000, m, 1 << 20), 32);
  // Prefill (tiles != tokens): only the fill.
  EXPECT_EQ(AttentionSplits(100, 1600, 20000, m, 1 << 20), 1);
  // tokens * splits within the partials.
  EXPECT_EQ(AttentionSplits(4, 4, 256, m, 40), 10);
}

TEST(StepPlan, GraphShapesComeFromTheBucketAndTheCapacity) {
  const cache::ModelCacheSpec spec = Spec(true);
  StepCapacity cap;
  cap.parts = 4096;
  cap.width = {64, 16, 0, 0};  // (at least the stride: EnsureCapacity)
  const StepShape s = GraphShape(64, 2, Model(), cap);
  EXPECT_EQ(s.tokens, 64);
  EXPECT_EQ(s.seqs, 64);
  EXPECT_EQ(s.tiles, 64);
  EXPECT_EQ(s.rows, 64);
  EXPECT_EQ(s.table_space[0], 64);
  EXPECT_EQ(s.table_space[1], 16);
  EXPECT_EQ(s.splits, 4 * 132 / (64 * 2));               // about 4 blocks per SM
  EXPECT_EQ(GraphShape(1, 2, Model(), cap).splits, 32);  // at most 32
  StepModel more = Model();
  more.decode_blocks_per_sm = 16;
  EXPECT_EQ(GraphShape(64, 2, more, cap).splits, 16);
  cap.parts = 512;  // 64 rows x 8 splits
  EXPECT_EQ(GraphShape(64, 2, more, cap).splits, 8);

  // BuildStepPlan of a graph step uses it; of others the step's own sizes.
  Batch b;
  for (int i = 0; i < 3; ++i) b.Add(1, 20, true);
  const StepSizes z = SizeStep(b.Done(2), {}, spec, 16, Model());
  cap.parts = 4096;
  const StepPlan p = BuildStepPlan(z, spec, 16, Model(), cap);
  EXPECT_EQ(p.shape.tokens, 4);
  EXPECT_EQ(p.shape.table_space[0], 64);
  EXPECT_EQ(p.meta_ints, p.layout.tables[1] + 4u * z.stride);
  EXPECT_LE(p.meta_ints, p.layout.total);
}

// The lean fp8 decode form (the default): graph splits aim at the blocks
// per SM it fits (at most decode_blocks_per_sm) and go past 32 up to
// kMaxAttentionSplits; the old form (fp8_decode_lean off), a bf16 cache of
// unknown fit, or without the mma.sync kernel, the plain rule.
TEST(StepPlan, LeanFp8DecodeSplitsFillItsBlocksPerSm) {
  EXPECT_TRUE(StepModel{}.fp8_decode_lean);  // the default form
  StepCapacity cap;
  cap.parts = 4096;
  cap.width = {64, 16, 0, 0};
  StepModel m = Model();  // 132 SMs
  m.num_kv_heads = 8;
  m.fp8 = true;
  m.fp8_decode_lean = false;  // the old form: at most 32
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 32);
  EXPECT_EQ(AttentionSplits(1, 1, 32768, m, 1 << 20), 32);
  EXPECT_EQ(DecodeWaveBlocks(m, true), 0);
  m.fp8_decode_lean = true;
  m.fp8_lean_blocks_per_sm = 4;  // head_dim 64
  // One sequence: 4 * 132 / 8 = 66 -> 64 (the merge's most).
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, kernels::kMaxAttentionSplits);
  EXPECT_EQ(GraphShape(2, 1, m, cap).splits, 33);  // 4 * 132 / 16
  EXPECT_EQ(GraphShape(64, 1, m, cap).splits, 1);  // 528 / 512
  m.fp8_lean_blocks_per_sm = 3;                    // head_dim 128: 3 * 132 / 8
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 49);
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits * 8, 392);  // one wave of 3 x 132
  // decode_blocks_per_sm below what the form fits wins.
  StepModel two = m;
  two.decode_blocks_per_sm = 2;
  EXPECT_EQ(GraphShape(1, 1, two, cap).splits, 33);
  // The partials' capacity still bounds it.
  cap.parts = 40;
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 40);
  cap.parts = 4096;
  // Not for bf16 caches (whose fit is their own, here unknown), nor with
  // the mma.sync kernel off.
  StepModel bf16 = m;
  bf16.fp8 = false;
  bf16.bf16_decode_blocks_per_sm = 0;
  EXPECT_EQ(GraphShape(1, 1, bf16, cap).splits, 32);
  StepModel wmma = m;
  wmma.mma_attention = false;
  EXPECT_EQ(GraphShape(1, 1, wmma, cap).splits, 32);
  EXPECT_FALSE(LeanFp8Decode(wmma, true));
  EXPECT_TRUE(LeanFp8Decode(m, true));
  EXPECT_FALSE(LeanFp8Decode(m, false));

  // Launched kernel by kernel (AttentionSplits): decode of a long context
  // goes past 32 to one wave of the form's blocks; prompts do not.
  m.fp8_lean_blocks_per_sm = 4;
  EXPECT_EQ(AttentionSplits(1, 1, 32768, m, 1 << 20), 64);
  m.fp8_lean_blocks_per_sm = 3;
  EXPECT_EQ(AttentionSplits(1, 1, 32768, m, 1 << 20), 49);
  EXPECT_EQ(AttentionSplits(1, 1, 4096, m, 1 << 20), 17);  // 16 by length, 17 to fill
  EXPECT_EQ(AttentionSplits(1, 1, 32768, bf16, 1 << 20), 32);
  EXPECT_EQ(AttentionSplits(1, 100, 32768, m, 1 << 20), 17);  // a prompt: the fill only
}

// bf16 decode under the same rule once its fit is known
// (bf16_decode_blocks_per_sm, from the device): one wave of that many blocks
// per SM, up to kMaxAttentionSplits; unknown (0), at most 32 as before.
TEST(StepPlan, Bf16DecodeSplitsFillItsBlocksPerSm) {
  StepCapacity cap;
  cap.parts = 4096;
  cap.width = {64, 16, 0, 0};
  StepModel m = Model();  // 132 SMs, bf16
  m.num_kv_heads = 8;
  ASSERT_FALSE(m.fp8);
  EXPECT_EQ(m.bf16_decode_blocks_per_sm, 0);
  EXPECT_EQ(DecodeWaveBlocks(m, true), 0);
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 32);
  EXPECT_EQ(AttentionSplits(1, 1, 32768, m, 1 << 20), 32);

  m.bf16_decode_blocks_per_sm = 5;  // more than decode_blocks_per_sm (4)
  EXPECT_EQ(DecodeWaveBlocks(m, true), 5);
  EXPECT_EQ(DecodeWaveBlocks(m, false), 0);  // prompts: never
  // One sequence: min(4, 5) * 132 / 8 = 66 -> 64 (the merge's most).
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, kernels::kMaxAttentionSplits);
  EXPECT_EQ(GraphShape(2, 1, m, cap).splits, 33);  // 4 * 132 / 16
  EXPECT_EQ(GraphShape(64, 1, m, cap).splits, 1);
  m.bf16_decode_blocks_per_sm = 3;  // a fourth block would start a second wave
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 49);
  m.bf16_decode_blocks_per_sm = 2;
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 33);  // 264 blocks: one wave of 2 x 132
  m.bf16_decode_blocks_per_sm = 4;
  // The partials' capacity still bounds it.
  cap.parts = 40;
  EXPECT_EQ(GraphShape(1, 1, m, cap).splits, 40);
  cap.parts = 4096;
  // Without the mma.sync kernel (its fit is not the other kernel's): 32.
  StepModel wmma = m;
  wmma.mma_attention = false;
  EXPECT_EQ(DecodeWaveBlocks(wmma, true), 0);
  EXPECT_EQ(GraphShape(1, 1, wmma, cap).splits, 32);
  // An fp8 cache follows its own form's fit, not the bf16 one.
  StepModel f8 = m;
  f8.fp8 = true;
  f8.fp8_decode_lean = false;
  EXPECT_EQ(GraphShape(1, 1, f8, cap).splits, 32);

  // Kernel by kernel: a long context goes past 32 to one wave; a short one
  // keeps the length rule; prompts only the fill.
  m.bf16_decode_blocks_per_sm = 4;
  EXPECT_EQ(AttentionSplits(1, 1, 32768, m, 1 << 20), 64);
  m.bf16_decode_blocks_per_sm = 3;
  EXPECT_EQ(AttentionSplits(1, 1, 32768, m, 1 << 20), 49);
  EXPECT_EQ(AttentionSplits(1, 1, 4096, m, 1 << 20), 17);
  EXPECT_EQ(AttentionSplits(1, 100, 32768, m, 1 << 20), 17);
  // Many sequences: the lower bound of 32 stays (4 * 132 / 512 is 1).
  EXPECT_EQ(AttentionSplits(64, 64, 32768, m, 1 << 20), 32);
}

TEST(StepPlan, AttentionRoutesPerGroup) {
  const cache::ModelCacheSpec spec = Spec(true);
  StepShape decode;
  decode.tokens = decode.seqs = decode.tiles = decode.rows = 4;
  StepRoutes r = RouteStep(decode, spec, 16, Model());
  EXPECT_TRUE(r.fused_rotary);
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(r.groups[g].qkv, AttentionRoute::Qkv::kInAttention) << g;
    EXPECT_TRUE(r.groups[g].store_before) << g;  // one token a sequence
    EXPECT_EQ(r.groups[g].store_after, AttentionRoute::StoreAfter::kNone) << g;
    EXPECT_FALSE(r.groups[g].kv_map) << g;  // narrow tiles
  }
  StepShape prefill;
  prefill.tokens = 100;
  prefill.seqs = 2;
  prefill.tiles = 7;
  prefill.wide = true;
  r = RouteStep(prefill, spec, 16, Model());
  EXPECT_FALSE(r.fused_rotary);
  // Full group: stored by QkvPost, pages copied by TMA.
  EXPECT_EQ(r.groups[0].qkv, AttentionRoute::Qkv::kPostStore);
  EXPECT_TRUE(r.groups[0].kv_map);
  EXPECT_EQ(r.groups[0].store_after, AttentionRoute::StoreAfter::kNone);
  // Ring: its slots may still be read by this step's queries: stored after.
  EXPECT_EQ(r.groups[1].qkv, AttentionRoute::Qkv::kPost);
  EXPECT_FALSE(r.groups[1].kv_map);
  EXPECT_EQ(r.groups[1].store_after, AttentionRoute::StoreAfter::kBf16);
  // No TMA descriptor for the group: rows by cp.async.
  StepModel nomap = Model();
  nomap.kv_map_ok[0] = false;
  EXPECT_FALSE(RouteStep(prefill, spec, 16, nomap).groups[0].kv_map);
  // Fused rotary turned off, or mma.sync attention off, or unsupported.
  for (int which = 0; which < 3; ++which) {
    StepModel m = Model();
    (which == 0 ? m.fused_rotary : which == 1 ? m.mma_attention : m.fused_rotary_supported) = false;
    const StepRoutes d = RouteStep(decode, spec, 16, m);
    EXPECT_FALSE(d.fused_rotary) << which;
    EXPECT_EQ(d.groups[0].qkv, AttentionRoute::Qkv::kPostStore) << which;
  }
  // fp8: quantized rows, stored after attention, never fused or mapped.
  StepModel f8 = Model();
  f8.fp8 = true;
  for (const StepShape& s : {decode, prefill}) {
    const StepRoutes q = RouteStep(s, spec, 16, f8);
    EXPECT_FALSE(q.fused_rotary);
    for (int g = 0; g < 2; ++g) {
      EXPECT_EQ(q.groups[g].qkv, AttentionRoute::Qkv::kPostQuantize8);
      EXPECT_EQ(q.groups[g].store_after, AttentionRoute::StoreAfter::kFp8);
      EXPECT_FALSE(q.groups[g].kv_map);
    }
  }
}

TEST(StepPlan, MetadataOfAMixedStep) {
  Batch b;
  b.Add(20, 0, true);  // prompt: tiles of 16 (wide)
  b.Add(1, 33, true, /*prev_row=*/1);
  b.Add(3, 7, false);
  const cache::ModelCacheSpec spec = Spec(false);
  const StepSizes z = SizeStep(b.Done(), {}, spec, 16, Model());
  const std::vector<int32_t> host_picks = {11, 22};
  const Written w = Write(b, z, spec, 16, {false, host_picks});
  const StepPlan& p = w.plan;
  const std::vector<int32_t>& meta = w.meta;
  ASSERT_EQ(p.shape.tokens, 24);
  ASSERT_EQ(p.shape.tiles, 4);
  const MetaLayout& ml = p.layout;

  EXPECT_EQ(meta[ml.strides], z.stride);
  EXPECT_EQ(meta[ml.store_logits], 1);  // rows default to kHost
  // Tokens, positions and their sequences, in batch order.
  EXPECT_EQ(meta[ml.tokens + 0], 0);
  EXPECT_EQ(meta[ml.tokens + 19], 19);
  EXPECT_EQ(meta[ml.tokens + 20], 22);  // prev_row 1's pick, from the host
  EXPECT_EQ(meta[ml.pos + 20], 33);
  EXPECT_EQ(meta[ml.tok_seq + 20], 1);
  EXPECT_EQ(meta[ml.tokens + 21], 200);
  EXPECT_EQ(meta[ml.pos + 23], 9);
  EXPECT_EQ(meta[ml.seq_start + 2], 7);
  EXPECT_EQ(meta[ml.seq_first + 0], 0);
  EXPECT_EQ(meta[ml.seq_first + 1], 20);
  EXPECT_EQ(meta[ml.seq_first + 2], 21);
  EXPECT_EQ(meta[ml.seq_first + 3], 24);
  // Logits rows: the last token of each sequence that wants them.
  EXPECT_EQ(meta[ml.logit_rows + 0], 19);
  EXPECT_EQ(meta[ml.logit_rows + 1], 20);
  // Tiles, longest key span first: the prompt's second tile (positions to
  // 19), the decode token (33), ... sorted by last position, descending.
  std::vector<int> last;
  for (int i = 0; i < p.shape.tiles; ++i) {
    const int t0 = meta[ml.tile_t0 + i], n = meta[ml.tile_n + i];
    last.push_back(meta[ml.pos + t0 + n - 1]);
  }
  EXPECT_EQ(last, (std::vector<int>{33, 19, 15, 9}));
  // Tables zero-padded to the stride.
  EXPECT_EQ(meta[ml.tables[0] + 16 * 1 + 0], 10);
  EXPECT_EQ(meta[ml.tables[0] + 16 * 1 + 2], 12);
  EXPECT_EQ(meta[ml.tables[0] + 16 * 1 + 3], 0);

  // The previous step still running: the embedding reads row 1's pick.
  EXPECT_EQ(Write(b, z, spec, 16, {true, {}}).meta[ml.tokens + 20], -1 - 1);
}

TEST(StepPlan, GraphPaddingSequencesAreEmpty) {
  Batch b = Decoding(3, 5);
  const cache::ModelCacheSpec spec = Spec(false);
  const StepSizes z = SizeStep(b.Done(), Greedy(3), spec, 16, Model());
  ASSERT_TRUE(z.graph);
  const Written w = Write(b, z, spec, 32);
  const StepPlan& p = w.plan;
  const std::vector<int32_t>& meta = w.meta;
  const MetaLayout& ml = p.layout;
  EXPECT_EQ(meta[ml.store_logits], 0);  // all greedy: no logits stored
  EXPECT_EQ(meta[ml.pos + 3], -1);
  EXPECT_EQ(meta[ml.tokens + 3], 0);
  EXPECT_EQ(meta[ml.tile_n + 3], 0);
  EXPECT_EQ(meta[ml.tile_seq + 3], 3);
  EXPECT_EQ(meta[ml.seq_first + 4], 4);
  EXPECT_EQ(meta[ml.logit_rows + 3], 0);
  // Graph tiles stay in sequence order.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(meta[ml.tile_seq + i], i);
  // Tables at the step's stride (the kernels read it from the metadata),
  // padding sequences' zeroed; the capacity's width is only reserved.
  EXPECT_EQ(meta[ml.strides], 16);
  EXPECT_EQ(meta[ml.tables[0] + 16 * 2], 20);
  EXPECT_EQ(meta[ml.tables[0] + 16 * 3], 0);
  EXPECT_EQ(p.meta_ints, ml.tables[0] + 4u * 16);
  EXPECT_EQ(ml.total, ml.tables[0] + 4u * 32);
}

// A drafted step (speculative verification): a sequence running its last
// token and a draft asks a logits row for each of them; the rows are its
// last tokens in token order, between the other sequences' rows in batch
// order. Such a step is never a decode step, so never a graph, and its
// rows count every one of them (what the LM head, the picks and the
// logits copies are sized by).
TEST(StepPlan, DraftedSequencesGetARowPerVerifiedToken) {
  Batch b;
  b.Add(1, 40, true);  // decoding one token
  b.Add(5, 12, true);  // its last token and a draft of four
  b.Add(3, 7, false);  // a prompt chunk without logits
  b.Add(2, 9, true);   // a draft of one
  b.steps[1].logit_rows = 5;
  b.steps[3].logit_rows = 2;
  const cache::ModelCacheSpec spec = Spec(false);
  std::vector<RowPick> rows = Greedy(8);
  const StepSizes z = SizeStep(b.Done(), rows, spec, 16, Model());
  EXPECT_EQ(z.rows, 8);
  EXPECT_EQ(z.tokens, 11);
  EXPECT_FALSE(z.decode);
  EXPECT_FALSE(z.graph);
  EXPECT_EQ(z.padded, 4);
  EXPECT_TRUE(z.any_greedy);
  EXPECT_FALSE(z.any_logits);  // every row picked on the device
  const Written w = Write(b, z, spec, 16);
  const StepPlan& p = w.plan;
  const std::vector<int32_t>& meta = w.meta;
  EXPECT_EQ(p.shape.rows, 8);
  const MetaLayout& ml = p.layout;
  std::vector<int32_t> got(meta.begin() + ml.logit_rows, meta.begin() + ml.logit_rows + 8);
  // Tokens 0 | 1..5 | 6..8 | 9..10.
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 9, 10}));
  EXPECT_EQ(meta[ml.store_logits], 0);
  // A host row among them: the logits are stored.
  rows[3].mode = PickMode::kHost;
  const StepSizes h = SizeStep(b.steps, rows, spec, 16, Model());
  EXPECT_TRUE(h.any_logits);
  EXPECT_TRUE(h.any_greedy);
  // Rows past the plan are host rows (RowMode).
  const StepSizes none = SizeStep(b.steps, {}, spec, 16, Model());
  EXPECT_EQ(none.rows, 8);
  EXPECT_FALSE(none.any_greedy);
  EXPECT_TRUE(none.any_logits);
  // One row per sequence again: the same batch shape decodes under a graph.
  Batch d;
  d.Add(1, 40, true);
  d.Add(1, 12, true);
  const StepSizes one = SizeStep(d.Done(), rows, spec, 16, Model());
  EXPECT_EQ(one.rows, 2);
  EXPECT_TRUE(one.graph);
}

}  // namespace
}  // namespace agentkv::backend::cuda
