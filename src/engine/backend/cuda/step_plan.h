// The CUDA backend's step plan: what one forward step does, decided on the
// host from the batch and a few facts about the model and the device, as
// plain data. CudaBackend::LaunchStep sizes the step (SizeStep), grows its
// workspaces to fit, builds the plan (BuildStepPlan), writes the step's
// metadata (WriteStepMeta) and hands the plan to its executor (Enqueue),
// which launches what the plan says: the per-step decisions (row layout,
// per-sequence offsets, attention tiles and their order, which rows sample
// and how, graph bucket and padding, block-table stride, key splits, wide or
// narrow tiles) and the attention path of each cache group (RouteStep: fused
// rotary, K/V stored before or after attention, TMA page copies, fp8 rows).
// The GEMM and GEMV choices per row count stay with the backend (they ask
// the kernels' support predicates, which need the CUDA libraries).
//
// Plain C++, no CUDA headers: built and tested whether or not the build has
// CUDA. Pure functions; thread-compatible.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cache/model_cache_spec.h"
#include "engine/backend/backend.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda {

// Decode batch sizes graphs are captured for; a batch runs in the smallest
// bucket that holds it, padded (multiples of 64 beyond 256).
int DecodeBucket(int b);

// The smallest power of two >= n, and at least 16: block-table strides.
int Pow2AtLeast(int64_t n);

// Facts about the model, its device and the backend's tuning that the plan
// needs; constant for a backend once its KV cache is allocated.
struct StepModel {
  int num_kv_heads = 1;
  bool wide_supported = false;  // WideAttentionSupported(head_dim)
  // Tokens an attention tile holds: TokensPerTile(group_size, false/true).
  int narrow_tile_tokens = 16;
  int wide_tile_tokens = 64;
  // FusedRotarySupported(head_dim): the decode attention can apply the
  // rotary and store K and V itself.
  bool fused_rotary_supported = false;
  bool fp8 = false;  // the KV cache is e4m3
  // CudaTuning's switches the plan follows.
  bool graphs = true;
  bool fused_rotary = true;
  bool mma_attention = true;
  int decode_blocks_per_sm = 4;
  // fp8 decode on the lean kernel form (CudaTuning::fp8_decode_lean) and
  // the blocks per SM it is compiled for (kernels::MmaMinBlocks: 4 at
  // head_dim 64, 3 at 128): decode splits then aim at no more blocks per SM
  // than fit, and go up to kernels::kMaxAttentionSplits.
  bool fp8_decode_lean = true;
  int fp8_lean_blocks_per_sm = 4;
  // The bf16 decode form's resident blocks per SM on this device
  // (kernels::MmaBf16DecodeBlocksPerSm; 0: unknown, and bf16 decode splits
  // stop at 32 as before).
  int bf16_decode_blocks_per_sm = 0;
  int num_sms = 1;
  // Per cache group: whether its TMA descriptor exists (the warpgroup
  // prompt attention may copy whole pages).
  std::array<bool, kMaxCacheGroups> kv_map_ok{};
};

// Whether a step's attention runs on the lean fp8 decode form with its
// wider split range: decode steps (one token a tile) of an fp8 cache with
// fp8_decode_lean on the mma.sync kernel.
inline bool LeanFp8Decode(const StepModel& m, bool decode) {
  return decode && m.fp8 && m.fp8_decode_lean && m.mma_attention;
}

// The blocks per SM whose one wave a decode step's splits may fill past 32
// (up to kernels::kMaxAttentionSplits): the lean fp8 form's
// (fp8_lean_blocks_per_sm), or the bf16 mma.sync form's
// (bf16_decode_blocks_per_sm); 0 where splits stop at 32 (prompt steps, the
// old fp8 form, the kernels without mma_attention, an unknown bf16 fit).
inline int DecodeWaveBlocks(const StepModel& m, bool decode) {
  if (!decode || !m.mma_attention) return 0;
  if (m.fp8) return m.fp8_decode_lean ? m.fp8_lean_blocks_per_sm : 0;
  return m.bf16_decode_blocks_per_sm;
}

// The mode of want_logits row r: rows[r].mode, kHost past the end of rows.
PickMode RowMode(std::span<const RowPick> rows, int r);

// What a batch needs before any workspace is sized.
struct StepSizes {
  int tokens = 0;  // T: new tokens of the batch
  int seqs = 0;    // B: its sequences
  int rows = 0;    // W: logits rows (LogitRows of each sequence)
  // Every sequence decodes one token and wants logits.
  bool decode = false;
  int64_t need_blocks = 1;  // block-table entries the longest sequence reads
  // Some row is picked on the device (kGreedy or kDevice); some row's
  // logits go to the host (kHost); some row is drawn on the device
  // (kDevice: LaunchSampleRows reads the stored logits).
  bool any_greedy = false, any_logits = false, any_draw = false;
  // Some device-picked row asks for logprobs (RowPick::logprobs >= 0:
  // LaunchRowLogprobs reads the stored logits).
  bool any_logprobs = false;
  // Some device-picked row keeps its logits (RowPick::keep_logits: the
  // engine may read it back once the step is collected).
  bool any_keep = false;
  // Steps with prompt chunks take wide attention tiles where the head_dim
  // has them (a prefill re-reads the prefix once per tile); decode narrow.
  bool wide = false;
  int tokens_per_tile = 16;
  int tiles = 0;  // attention tiles of the unpadded batch
  // Run as a captured graph (pure decode, graphs on), padded to `padded`
  // sequences (DecodeBucket); padded == seqs otherwise.
  // Steps where a sequence asks several logits rows (speculative
  // verification: its last token and a draft) run kernel by kernel rather
  // than under a graph keyed by row count: a graph holds one StepShape
  // (tokens, tiles, rows, and the decode-only fused rotary), and drafts
  // vary in length per sequence and step, so a key by rows alone would not
  // do; one by every split of the draft tokens (or drafts padded to the
  // longest) multiplies captures, their memory and wasted verification.
  // Drafted steps only come in batches below the engine's compute-bound
  // size, where a step streams all the weights (milliseconds on an 8B
  // model) and the host queues the launches ahead of the device. Every
  // one-row step keeps its graph as before.
  bool graph = false;
  int padded = 0;
  int stride = 16;  // block-table ints per sequence and group
  // Rows every activation workspace must hold.
  int workspace_tokens() const { return graph ? padded : tokens; }
};
StepSizes SizeStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                   const cache::ModelCacheSpec& spec, int block_size, const StepModel& model);

// The sizes one enqueued forward pass is built for; a graph is valid for
// exactly one shape.
struct StepShape {
  int tokens = 0;     // rows of every activation (padded in graphs)
  int seqs = 0;       // sequence entries (padded in graphs)
  int tiles = 0;      // attention tiles
  int rows = 0;       // logits rows
  int splits = 1;     // attention key splits
  bool wide = false;  // wide attention tiles (steps with prompt chunks)
  // Block-table ints reserved per sequence and group: the step's own
  // width, or in graphs the capacity (the width itself is in the metadata).
  std::array<int, kMaxCacheGroups> table_space{};
};

// Offsets (in int32) of the per-step metadata arrays in the backend's
// metadata buffers; a function of the StepShape alone, so a graph's
// addresses stay valid.
struct MetaLayout {
  // store_logits: 1 if some row of the step samples or keeps its logits
  // (the LM head then stores its logits; greedy rows need only the argmax).
  size_t strides, store_logits, tokens, pos, tok_seq, tile_seq, tile_t0, tile_n, logit_rows,
      seq_start, seq_first;
  std::array<size_t, kMaxCacheGroups> tables;
  size_t total;
};
MetaLayout LayoutOf(const StepShape& s);

// The workspaces as sized when the plan is built.
struct StepCapacity {
  int64_t parts = 0;                         // attention split partials (rows x splits)
  std::array<int, kMaxCacheGroups> width{};  // block-table ints per sequence
};

// Key splits of a step launched kernel by kernel: a block per SM at least,
// and (decode) no block walking more than ~256 keys; at most 32 (decode
// with DecodeWaveBlocks: as many as that many blocks per SM fill the SMs
// with in one wave, from 32 up to kMaxAttentionSplits), and tokens * splits
// within the partials' capacity.
int AttentionSplits(int tiles, int tokens, int64_t max_keys, const StepModel& model,
                    int64_t cap_parts);

// The shape of a graph step of `bucket` sequences (width-independent:
// table space is the capacity's, splits come from the bucket alone).
StepShape GraphShape(int bucket, int groups, const StepModel& model, const StepCapacity& cap);

// How one cache group's layers run attention in a step of this shape.
struct AttentionRoute {
  // The QKV projection stays fp32 and the attention kernel applies the
  // rotary and stores the token's K and V itself (decode, bf16).
  bool fused_rotary = false;
  // K and V go to the cache before attention (QkvPostStore, or the fused
  // kernel) rather than after it.
  bool store_before = false;
  // The warpgroup prompt attention copies whole pages by TMA (the caller
  // then asks AttentionReadsCacheOnly whether k and v rows are needed).
  bool kv_map = false;
  // What runs between the projection and attention.
  enum class Qkv {
    kInAttention,    // nothing: the fused kernel does it
    kPost,           // QkvPost (q, k, v rows)
    kPostStore,      // QkvPostStore (also stores K and V)
    kPostQuantize8,  // QkvPost, then the fp8 rows quantized
  };
  Qkv qkv = Qkv::kPost;
  // What stores K and V after attention.
  enum class StoreAfter { kNone, kBf16, kFp8 };
  StoreAfter store_after = StoreAfter::kNone;
};

// Per cache group (rings from spec at block_size), for a step of shape s.
struct StepRoutes {
  bool fused_rotary = false;  // the same for every group
  std::array<AttentionRoute, kMaxCacheGroups> groups{};
};
StepRoutes RouteStep(const StepShape& s, const cache::ModelCacheSpec& spec, int block_size,
                     const StepModel& model);

// Everything the executor needs to launch a step.
struct StepPlan {
  StepSizes sizes;
  StepShape shape;
  MetaLayout layout{};
  StepRoutes routes;
  // Metadata ints to upload: up to the last group's tables of the padded
  // sequences (in graphs the reserved tail is not sent).
  size_t meta_ints = 0;
};
// Requires the workspaces grown for sizes (cap.width >= sizes.stride per
// group, parts for the splits).
StepPlan BuildStepPlan(const StepSizes& sizes, const cache::ModelCacheSpec& spec, int block_size,
                       const StepModel& model, const StepCapacity& cap);

// The previous step's picks, for the tokens of steps with prev_row >= 0:
// still on the device (the embedding reads them: token -1 - row), or on the
// host.
struct PrevPicks {
  bool on_device = false;
  std::span<const int32_t> host;
};

// Writes the step's metadata in plan.layout into meta (plan.layout.total
// ints at least): strides, store_logits, tokens, positions, token ->
// sequence, tiles (longest key span first for kernel-by-kernel steps with
// several tiles: the kernel takes them in this order), logits rows (the
// token index of each: a sequence's last LogitRows tokens in token order,
// sequences in batch order, as Backend::Forward lays its rows out),
// sequence starts and first tokens, block tables (zero-padded to the
// stride); graph padding sequences get an empty tile, position -1 and
// zeroed tables. `scratch` is reused between calls.
void WriteStepMeta(std::span<const SeqStep> batch, const StepPlan& plan, int num_groups,
                   PrevPicks prev, std::span<int32_t> meta,
                   std::vector<std::array<int, 4>>* scratch);

}  // namespace agentkv::backend::cuda
