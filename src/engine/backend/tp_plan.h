// TpPlan: how one model is split over the N GPUs of a host (tensor
// parallelism, Megatron style; docs/tensor-parallel.md). A pure decision:
// what each rank holds and computes, and how each checkpoint tensor is cut
// for it. The CUDA backend's ranks run it; the CPU tests check that the
// shards' partial results, summed as an all-reduce sums them, equal the
// unsplit model's.
//
// The split, for degree N and rank r:
// - attention: query heads by contiguous ranges of num_heads / N (q_proj
//   rows, its bias, the sinks); KV heads likewise when N divides
//   num_kv_heads. With fewer KV heads than ranks (N a multiple of
//   num_kv_heads) each KV head is replicated on N / num_kv_heads ranks,
//   the ones whose query heads read it: every rank still holds exactly one
//   KV head, so KV memory per GPU stops shrinking there. Any other
//   combination is refused. o_proj by its input columns (the rank's query
//   heads): each rank's product is a partial sum of the full output.
// - dense MLP: gate and up by output rows (intermediate / N each), down by
//   its input columns: again a partial sum.
// - mixture of experts: every rank holds every expert, each expert's
//   intermediate split as the dense MLP's (expert_intermediate / N). The
//   router is replicated and reads the same residual on every rank, so
//   every rank routes identically; each does 1/N of every selected
//   expert's work, whatever the routing (no rank waits for one that drew
//   the popular experts), the grouped GEMMs run unchanged at a smaller I,
//   and the layer ends in one all-reduce as a dense one. Splitting experts
//   across ranks instead would leave a decode step's k experts on a few
//   ranks while the others idle. MXFP4 experts whose slices would cut a
//   32-value block hold the whole blocks around them (TpRank::expert_held,
//   padded alike on every rank; the columns a rank does not own zeroed in
//   its down projection).
// - embedding and LM head by vocabulary: contiguous ranges of ceil(V / N)
//   rows (the last rank's shorter). A rank embeds the tokens in its range
//   and zeros for the others (summed: the full embedding); its logits are
//   its vocabulary slice, combined by TpArgmaxKey / TpLogSumExp
//   (tp_combine.h) without gathering them.
// - biases of the row-split outputs (o_proj, GPT-OSS's expert down bias)
//   are held by rank 0 only (TensorCut::kZero elsewhere): summed once.
// - norms, q/k norms, routers: replicated (TensorCut::kWhole).
//
// Thread-safety: immutable after Make; pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/model_cache_spec.h"
#include "engine/model/model_config.h"
#include "util/status.h"

namespace agentkv::backend {

// [begin, begin + size).
struct TpRange {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
  bool operator==(const TpRange&) const = default;
};

// What one rank holds.
struct TpRank {
  int rank = 0;
  TpRange q_heads;
  TpRange kv_heads;
  TpRange intermediate;         // dense MLP columns (gate/up rows, down columns)
  TpRange expert_intermediate;  // every expert's columns (MoE models; else empty)
  // The expert columns the rank holds and computes: expert_intermediate,
  // except for MXFP4 experts whose slices would cut a 32-value block: then
  // the whole blocks around it, as many on every rank (past the last
  // column: zero padding), the columns it does not own zeroed in its down
  // projection (docs/tensor-parallel.md, "MXFP4").
  TpRange expert_held;
  TpRange vocab;  // embedding rows and LM head rows
  // Whether this rank holds the biases of row-split outputs (rank 0).
  bool adds_row_biases = false;
  // Whether this rank is the first holder of its KV heads (the one whose
  // copy is read for the host tier and the store when heads are replicated).
  bool primary_kv = true;
};

// How a rank's slice of one checkpoint tensor is cut from the full tensor.
struct TensorCut {
  enum class Kind {
    kWhole,  // the full tensor (replicated)
    // Indices [begin, begin + size) of dimension `dim`; with parts > 1, of
    // each of the `parts` equal blocks that dimension is made of (a fused
    // [gate; up] tensor), concatenated.
    kSlice,
    kZero,  // the full shape, all zeros (a row-split output's bias off rank 0)
  };
  Kind kind = Kind::kWhole;
  int dim = 0;
  int64_t begin = 0;
  int64_t size = 0;
  int parts = 1;
  // kSlice: indices of a part past its end are zeros (padding), and so are
  // those outside [keep_begin, keep_end) (columns another rank owns).
  int64_t keep_begin = 0;
  int64_t keep_end = INT64_MAX;
  bool operator==(const TensorCut&) const = default;
  // Whether the cut pads or zeroes any index of a dimension of `n`.
  bool Masks(int64_t n) const {
    const int64_t part = n / parts;
    return kind == Kind::kSlice &&
           (begin + size > part || keep_begin > begin || keep_end < begin + size);
  }
};

struct TpPlan {
  int degree = 1;
  // Ranks holding each KV head: 1 when the degree divides num_kv_heads,
  // degree / num_kv_heads when KV heads are replicated.
  int kv_replicas = 1;
  std::vector<TpRank> ranks;

  // Splits `config` over `degree` ranks. `visible_gpus`: the GPUs the
  // process sees (-1: not checked). Errors (InvalidArgument) name the
  // quantity that does not divide, or the GPUs missing: degree below 1 or
  // above visible_gpus; num_heads not divisible by the degree; num_kv_heads
  // neither divisible by it nor dividing it; intermediate sizes (dense and
  // expert) not divisible into slices of a multiple of kTpAlign; a
  // vocabulary smaller than the degree; quantized weights a slice would
  // cut where their scales cannot follow: MXFP4 experts whose intermediate
  // size is not whole 32-value blocks (slices off the blocks are held as
  // whole blocks: TpRank::expert_held), fp8 block
  // scales whose column slices (o_proj, down_proj, experts' down_proj)
  // leave blocks narrower than kTpQuantColumns (TpCutBlock), each naming
  // the tensor. fp8 row slices off the block grid are allowed: the rank's
  // grid is refined so that its blocks share the full grid's boundary
  // block's scale (TpCutQuantized).
  static Result<TpPlan> Make(const model::ModelConfig& config, int degree, int visible_gpus);

  // The config rank `rank`'s backend runs: num_heads, num_kv_heads,
  // intermediate_size, moe.expert_intermediate and vocab_size of its slices;
  // everything else (head_dim, norms, rope, attention scale) unchanged.
  model::ModelConfig RankConfig(const model::ModelConfig& config, int rank) const;

  // How rank `rank`'s slice of checkpoint tensor `name` (of `config`, as
  // ExpectedWeights names and shapes it, or Qwen3-MoE's fused expert
  // tensors, TpFusedExpertShapes) is cut. Unknown names are kWhole.
  TensorCut CutOf(const model::ModelConfig& config, const std::string& name, int rank) const;
  // The same cut for the weight stored quantized, in its logical [.., out,
  // in] dimensions (WeightSource::LoadQuantized's shape; TpCutQuantized
  // applies it): CutOf's, except for GPT-OSS's fused experts, whose float
  // tensors are [E, in, out] (CutOf's dimensions) and quantized ones
  // [E, out, in].
  TensorCut QuantCutOf(const model::ModelConfig& config, const std::string& name, int rank) const;
};

// Quantized columns per rank must come in multiples of this many (the
// quantized kernels' 16-byte loads of fp8 codes never straddle a scale
// block).
inline constexpr int64_t kTpQuantColumns = 16;

// Qwen3-MoE checkpoints may store each sparse layer's experts fused (as
// transformers 5 saves them): mlp.experts.gate_up_proj [E, 2I, H] (gate
// rows, then up rows) and mlp.experts.down_proj [E, H, I]. Their names and
// full shapes for `config` (none for other architectures).
std::vector<std::pair<std::string, std::vector<int64_t>>> TpFusedExpertShapes(
    const model::ModelConfig& config);

// Slices per rank must be multiples of this many elements (16-byte rows of
// bf16: the kernels' vector loads).
inline constexpr int64_t kTpAlign = 8;

// The shape of a cut of a tensor of `shape`.
std::vector<int64_t> CutShape(std::span<const int64_t> shape, const TensorCut& cut);

// The cut of `full` (row-major, of `shape`). kZero: zeros of the full shape.
template <typename T>
std::vector<T> CutTensor(std::span<const T> full, std::span<const int64_t> shape,
                         const TensorCut& cut) {
  if (cut.kind == TensorCut::Kind::kWhole) return std::vector<T>(full.begin(), full.end());
  if (cut.kind == TensorCut::Kind::kZero) return std::vector<T>(full.size(), T{});
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < cut.dim; ++d) outer *= shape[d];
  for (size_t d = cut.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[cut.dim], block = n / cut.parts, taken = cut.size * cut.parts;
  // The indices [lo, hi) of each part's slice that hold values.
  const int64_t lo = std::max(cut.begin, cut.keep_begin);
  const int64_t hi = std::min({cut.begin + cut.size, block, cut.keep_end});
  std::vector<T> out(static_cast<size_t>(outer * taken * inner), T{});
  if (hi <= lo) return out;
  for (int64_t o = 0; o < outer; ++o)
    for (int p = 0; p < cut.parts; ++p) {
      const T* src = full.data() + (o * n + p * block + lo) * inner;
      std::copy(src, src + (hi - lo) * inner,
                out.data() + (o * taken + p * cut.size + lo - cut.begin) * inner);
    }
  return out;
}

// One contiguous copy between a block in the single-GPU layout (all heads:
// backend.h's ReadBlock layout) and a rank's block (its heads only).
struct TpKvRun {
  size_t global_offset = 0;
  size_t rank_offset = 0;
  size_t bytes = 0;
};

// The copies that move rank `rank`'s heads of one block of cache group
// `group` between the two layouts (either direction), for `spec` (the
// global, all-heads spec) and `block_size`. Covers every byte of the rank's
// block exactly once; fp8 blocks move codes and scales.
std::vector<TpKvRun> TpKvRuns(const cache::ModelCacheSpec& spec, const TpPlan& plan, int rank,
                              int group, int block_size);

// Rank block -> its heads of the global block / global block -> rank block,
// by the runs of TpKvRuns.
void TpMergeKvBlock(std::span<const TpKvRun> runs, std::span<const std::byte> rank_block,
                    std::span<std::byte> global_block);
void TpSplitKvBlock(std::span<const TpKvRun> runs, std::span<const std::byte> global_block,
                    std::span<std::byte> rank_block);

}  // namespace agentkv::backend
