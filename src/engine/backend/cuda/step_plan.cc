#include "engine/backend/cuda/step_plan.h"

#include <algorithm>

#include "engine/backend/cuda/kernels/kv_route.h"

namespace agentkv::backend::cuda {

int DecodeBucket(int b) {
  static constexpr int kBuckets[] = {1,  2,  4,  8,   16,  24,  32,  40,  48, 56,
                                     64, 80, 96, 112, 128, 160, 192, 224, 256};
  for (int k : kBuckets)
    if (b <= k) return k;
  return (b + 63) / 64 * 64;
}

int Pow2AtLeast(int64_t n) {
  int p = 16;
  while (p < n) p *= 2;
  return p;
}

PickMode RowMode(std::span<const RowPick> rows, int r) {
  return r < static_cast<int>(rows.size()) ? rows[r].mode : PickMode::kHost;
}

StepSizes SizeStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                   const cache::ModelCacheSpec& spec, int block_size, const StepModel& model) {
  StepSizes z;
  const int bs = block_size;
  z.seqs = static_cast<int>(batch.size());
  z.decode = z.seqs > 0;
  for (const SeqStep& st : batch) {
    const int n = static_cast<int>(st.tokens.size());
    z.tokens += n;
    z.rows += LogitRows(st);
    // (A sequence with several logits rows runs several tokens: never a
    // decode step, so never a graph.)
    z.decode = z.decode && n == 1 && st.want_logits;
    const int64_t end = st.start_pos + static_cast<int64_t>(n);
    for (size_t g = 0; g < spec.groups.size(); ++g) {
      const int ring = spec.RingBlocks(static_cast<int>(g), bs);
      z.need_blocks =
          std::max<int64_t>(z.need_blocks, ring > 0 ? std::min<int64_t>(ring, (end + bs - 1) / bs)
                                                    : (end + bs - 1) / bs);
    }
  }
  for (int r = 0; r < z.rows; ++r) {
    const PickMode pm = RowMode(rows, r);
    z.any_greedy = z.any_greedy || pm != PickMode::kHost;
    z.any_logits = z.any_logits || pm == PickMode::kHost;
    z.any_draw = z.any_draw || pm == PickMode::kDevice;
    z.any_logprobs = z.any_logprobs || (pm != PickMode::kHost && rows[r].logprobs >= 0);
    z.any_keep = z.any_keep || (pm != PickMode::kHost && rows[r].keep_logits != 0);
  }
  z.wide = kernels::RouteWideTiles(z.decode, model.wide_supported);
  z.tokens_per_tile = z.wide ? model.wide_tile_tokens : model.narrow_tile_tokens;
  for (const SeqStep& st : batch)
    z.tiles += (static_cast<int>(st.tokens.size()) + z.tokens_per_tile - 1) / z.tokens_per_tile;
  z.graph = model.graphs && z.decode;
  z.padded = z.graph ? DecodeBucket(z.seqs) : z.seqs;
  z.stride = Pow2AtLeast(z.need_blocks);
  return z;
}

MetaLayout LayoutOf(const StepShape& s) {
  MetaLayout m{};
  size_t o = 0;
  auto take = [&o](size_t n) {
    const size_t at = o;
    o += n;
    return at;
  };
  m.strides = take(kMaxCacheGroups);
  m.store_logits = take(1);
  m.tokens = take(s.tokens);
  m.pos = take(s.tokens);
  m.tok_seq = take(s.tokens);
  m.tile_seq = take(s.tiles);
  m.tile_t0 = take(s.tiles);
  m.tile_n = take(s.tiles);
  m.logit_rows = take(s.rows);
  m.seq_start = take(s.seqs);
  m.seq_first = take(s.seqs + 1);
  for (int g = 0; g < kMaxCacheGroups; ++g)
    m.tables[g] = take(static_cast<size_t>(s.seqs) * s.table_space[g]);
  m.total = o;
  return m;
}

int AttentionSplits(int tiles, int tokens, int64_t max_keys, const StepModel& model,
                    int64_t cap_parts) {
  // A block per SM at least, and no block walking more than ~256 keys (its
  // tiles are a serial chain of loads and syncs).
  const int per = std::max(1, tiles * model.num_kv_heads);
  const int fill = (model.num_sms + per - 1) / per;
  // (Decode only: prefill tiles are many and already fill the GPU.)
  const int len = tiles == tokens ? static_cast<int>((max_keys + 255) / 256) : 1;
  // Decode on a form whose fit is known (the lean fp8 one, the bf16 one):
  // as many splits as its blocks fill the SMs with (one wave), up to
  // kMaxAttentionSplits; 32 otherwise.
  const int wave = DecodeWaveBlocks(model, tiles == tokens);
  const int most =
      wave > 0 ? std::clamp(wave * model.num_sms / per, 32, kernels::kMaxAttentionSplits) : 32;
  int s = std::clamp(std::max(fill, len), 1, most);
  while (s > 1 && static_cast<int64_t>(tokens) * s > cap_parts) --s;
  return s;
}

StepShape GraphShape(int bucket, int groups, const StepModel& model, const StepCapacity& cap) {
  StepShape sh;
  sh.tokens = sh.seqs = sh.tiles = sh.rows = bucket;
  for (int g = 0; g < groups; ++g) sh.table_space[g] = cap.width[g];
  // Splits from the bucket alone (the graph must not depend on the context
  // length; the kernel divides each sequence's own keys among them): about
  // 4 blocks per SM, as many as 32 per head for small batches. The decode
  // kernel's four warps already split each block's keys; more global splits
  // measured slower (c64 18.0k tok/s at 16 per SM, 19.5k at 4, 16.1k at 64).
  // CudaTuning::decode_blocks_per_sm overrides the 4 (for measurements).
  // Forms whose fit is known (DecodeWaveBlocks: the lean fp8 one, the bf16
  // one): no more blocks per SM than fit (the lean fp8 form at head_dim
  // 128: 3, a fourth would start a second wave), up to kMaxAttentionSplits
  // (one sequence of 8 KV heads on 132 SMs: 64 at 4 an SM, 49 at 3). bf16
  // at head_dim 64 measured 25.1 us at 64 splits against 28.7 at 32 (one
  // sequence, 32k keys, H200); at 128, 64 splits (two waves) 60.8 against
  // 52.3.
  const int per = std::max(1, bucket * model.num_kv_heads);
  const int wave = DecodeWaveBlocks(model, true);
  const int blocks =
      wave > 0 ? std::min(model.decode_blocks_per_sm, wave) : model.decode_blocks_per_sm;
  int s = std::clamp(blocks * model.num_sms / per, 1, wave > 0 ? kernels::kMaxAttentionSplits : 32);
  while (s > 1 && static_cast<int64_t>(bucket) * s > cap.parts) --s;
  sh.splits = s;
  return sh;
}

StepRoutes RouteStep(const StepShape& s, const cache::ModelCacheSpec& spec, int block_size,
                     const StepModel& model) {
  StepRoutes r;
  const bool one_token_per_seq = s.tokens == s.seqs;
  // Decode steps: the attention kernel applies the rotary itself and
  // stores the token's K and V (one kernel less per layer; the mma.sync
  // kernel's, so not with it turned off).
  r.fused_rotary =
      kernels::RouteFusedRotary(model.fp8, model.fused_rotary, one_token_per_seq, s.wide,
                                model.mma_attention && model.fused_rotary_supported);
  for (size_t g = 0; g < spec.groups.size() && g < r.groups.size(); ++g) {
    AttentionRoute& a = r.groups[g];
    const bool ring = spec.RingBlocks(static_cast<int>(g), block_size) != 0;
    a.fused_rotary = r.fused_rotary;
    // K and V go to the cache straight from the rotary kernel unless a ring
    // slot they overwrite may still be read by another query of this step
    // (fp8: always after attention, from the quantized rows it read).
    a.store_before = kernels::RouteStoreBeforeAttention(model.fp8, ring, one_token_per_seq);
    a.kv_map = kernels::RouteKvMap(model.fp8, s.wide, a.store_before, ring, model.kv_map_ok[g]);
    if (model.fp8) {
      a.qkv = AttentionRoute::Qkv::kPostQuantize8;
    } else if (a.fused_rotary) {
      a.qkv = AttentionRoute::Qkv::kInAttention;
    } else {
      a.qkv = a.store_before ? AttentionRoute::Qkv::kPostStore : AttentionRoute::Qkv::kPost;
    }
    a.store_after = model.fp8         ? AttentionRoute::StoreAfter::kFp8
                    : !a.store_before ? AttentionRoute::StoreAfter::kBf16
                                      : AttentionRoute::StoreAfter::kNone;
  }
  return r;
}

StepPlan BuildStepPlan(const StepSizes& sizes, const cache::ModelCacheSpec& spec, int block_size,
                       const StepModel& model, const StepCapacity& cap) {
  StepPlan p;
  p.sizes = sizes;
  const int groups = static_cast<int>(spec.groups.size());
  if (sizes.graph) {
    p.shape = GraphShape(sizes.padded, groups, model, cap);
  } else {
    p.shape.tokens = sizes.tokens;
    p.shape.seqs = sizes.seqs;
    p.shape.tiles = sizes.tiles;
    p.shape.rows = sizes.rows;
    p.shape.wide = sizes.wide;
    for (int g = 0; g < groups; ++g) p.shape.table_space[g] = sizes.stride;
    p.shape.splits =
        AttentionSplits(p.shape.tiles, p.shape.tokens,
                        static_cast<int64_t>(sizes.stride) * block_size, model, cap.parts);
  }
  p.layout = LayoutOf(p.shape);
  p.routes = RouteStep(p.shape, spec, block_size, model);
  p.meta_ints = groups > 0
                    ? p.layout.tables[groups - 1] + static_cast<size_t>(sizes.padded) * sizes.stride
                    : p.layout.tables[0];
  return p;
}

void WriteStepMeta(std::span<const SeqStep> batch, const StepPlan& plan, int num_groups,
                   PrevPicks prev, std::span<int32_t> meta,
                   std::vector<std::array<int, 4>>* scratch) {
  const StepSizes& z = plan.sizes;
  const MetaLayout& ml = plan.layout;
  const int B = z.seqs, tpt = z.tokens_per_tile, stride = z.stride;
  int32_t* m = meta.data();
  int t = 0, tile = 0, row = 0;
  for (int g = 0; g < kMaxCacheGroups; ++g) m[ml.strides + g] = stride;
  m[ml.store_logits] = z.any_logits || z.any_draw || z.any_logprobs || z.any_keep ? 1 : 0;
  for (int s = 0; s < B; ++s) {
    const SeqStep& st = batch[s];
    const int n = static_cast<int>(st.tokens.size());
    m[ml.seq_start + s] = st.start_pos;
    m[ml.seq_first + s] = t;
    for (int i = 0; i < n; i += tpt, ++tile) {
      m[ml.tile_seq + tile] = s;
      m[ml.tile_t0 + tile] = t + i;
      m[ml.tile_n + tile] = std::min(tpt, n - i);
    }
    for (int i = 0; i < n; ++i, ++t) {
      m[ml.tokens + t] = st.tokens[i];
      // (-1 - row: the embedding reads the pick of `row` from the device.)
      if (i == n - 1 && st.prev_row >= 0)
        m[ml.tokens + t] = prev.on_device ? -1 - st.prev_row : prev.host[st.prev_row];
      m[ml.pos + t] = st.start_pos + i;
      m[ml.tok_seq + t] = s;
    }
    // Its last LogitRows tokens, in token order (t is one past the last).
    for (int j = LogitRows(st); j > 0; --j) m[ml.logit_rows + row++] = t - j;
    for (int g = 0; g < num_groups; ++g) {
      int32_t* tab = m + ml.tables[g] + static_cast<size_t>(s) * stride;
      const size_t k = std::min<size_t>(st.block_tables[g].size(), stride);
      std::copy_n(st.block_tables[g].begin(), k, tab);
      std::fill(tab + k, tab + stride, 0);
    }
  }
  if (!z.graph && z.tiles > 1) {
    // Longest key span first (the kernel takes tiles in this order): with
    // one prompt's tiles in position order, its last, longest ones started
    // last and the step waited on them.
    scratch->clear();
    for (int i = 0; i < z.tiles; ++i) {
      const int t0 = m[ml.tile_t0 + i], n = m[ml.tile_n + i];
      scratch->push_back({m[ml.pos + t0 + n - 1], m[ml.tile_seq + i], t0, n});
    }
    std::sort(scratch->begin(), scratch->end(),
              [](const auto& a, const auto& b) { return a[0] > b[0]; });
    for (int i = 0; i < z.tiles; ++i) {
      m[ml.tile_seq + i] = (*scratch)[i][1];
      m[ml.tile_t0 + i] = (*scratch)[i][2];
      m[ml.tile_n + i] = (*scratch)[i][3];
    }
  }
  for (int s = B; s < z.padded; ++s, ++t, ++tile, ++row) {  // graph padding
    m[ml.seq_start + s] = 0;
    m[ml.seq_first + s] = t;
    m[ml.tile_seq + tile] = s;
    m[ml.tile_t0 + tile] = t;
    m[ml.tile_n + tile] = 0;
    m[ml.tokens + t] = 0;
    m[ml.pos + t] = -1;
    m[ml.tok_seq + t] = s;
    m[ml.logit_rows + row] = 0;
    for (int g = 0; g < num_groups; ++g)
      std::fill_n(m + ml.tables[g] + static_cast<size_t>(s) * stride, stride, 0);
  }
  m[ml.seq_first + z.padded] = t;
}

}  // namespace agentkv::backend::cuda
