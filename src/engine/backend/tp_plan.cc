#include "engine/backend/tp_plan.h"

#include <algorithm>
#include <cstring>

#include "engine/backend/tp_quant_cut.h"
#include "engine/model/quant_format.h"

namespace agentkv::backend {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string Gpus(int n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

// `what` (size `n`) split into `degree` slices of a multiple of `align`.
Status CheckSplit(const std::string& what, int64_t n, int degree, int64_t align) {
  if (n % degree != 0)
    return InvalidArgument("--tensor-parallel " + std::to_string(degree) + ": " + what + " " +
                           std::to_string(n) + " is not divisible by " + std::to_string(degree));
  if ((n / degree) % align != 0)
    return InvalidArgument("--tensor-parallel " + std::to_string(degree) + ": " + what + " " +
                           std::to_string(n) + " splits into slices of " +
                           std::to_string(n / degree) + ", not a multiple of " +
                           std::to_string(align));
  return Status::Ok();
}

TensorCut Slice(int dim, int64_t begin, int64_t size, int parts = 1) {
  return {TensorCut::Kind::kSlice, dim, begin, size, parts};
}

}  // namespace

Result<TpPlan> TpPlan::Make(const model::ModelConfig& c, int degree, int visible_gpus) {
  if (degree < 1)
    return InvalidArgument("--tensor-parallel must be at least 1, not " + std::to_string(degree));
  if (visible_gpus >= 0 && degree > visible_gpus)
    return InvalidArgument("--tensor-parallel " + std::to_string(degree) + " needs " +
                           Gpus(degree) + "; this process sees " + Gpus(visible_gpus));
  if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.vocab_size <= 0)
    return InvalidArgument("--tensor-parallel: model has no heads or vocabulary");
  const std::string tp = "--tensor-parallel " + std::to_string(degree) + ": ";
  if (c.num_heads % degree != 0)
    return InvalidArgument(tp + "attention heads " + std::to_string(c.num_heads) +
                           " are not divisible by " + std::to_string(degree));
  TpPlan p;
  p.degree = degree;
  if (c.num_kv_heads % degree != 0) {
    if (degree % c.num_kv_heads != 0)
      return InvalidArgument(tp + "KV heads " + std::to_string(c.num_kv_heads) +
                             " neither divide into " + std::to_string(degree) +
                             " ranks nor divide them (for replication)");
    p.kv_replicas = degree / c.num_kv_heads;
  }
  // The dense MLP (GPT-OSS has none: every layer is experts).
  bool dense_mlp = false;
  for (int l = 0; l < c.num_layers; ++l) dense_mlp = dense_mlp || !c.IsMoeLayer(l);
  const int64_t align = kTpAlign;
  if (dense_mlp)
    RETURN_IF_ERROR(CheckSplit("intermediate size", c.intermediate_size, degree, align));
  if (c.IsMoe())
    RETURN_IF_ERROR(
        CheckSplit("expert intermediate size", c.moe.expert_intermediate, degree, align));
  if (c.vocab_size < degree)
    return InvalidArgument(tp + "vocabulary " + std::to_string(c.vocab_size) +
                           " is smaller than the degree");
  if (c.quant.quantized() && degree > 1) {
    // Scales follow their weights' cuts (TpCutQuantized). MXFP4 (GPT-OSS's
    // experts) holds one power-of-two scale per 32 inputs: the experts'
    // down projection takes its input split, and a slice must hold whole
    // blocks (a block's 32 values cannot be shared by two ranks without
    // the kernels reading blocks from an offset). fp8 block scales: a row
    // slice off the grid refines the rank's grid (any row count works); a
    // column slice must leave blocks of whole 16-column loads.
    // Per-channel and per-tensor fp8 scales cut with their rows or not at
    // all.
    const int64_t qrows = static_cast<int64_t>(c.num_heads / degree) * c.head_dim;
    auto covered = [&](const std::string& module) {
      for (int l = 0; l < c.num_layers; ++l)
        if (c.quant.Covers("model.layers." + std::to_string(l) + "." + module)) return true;
      return false;
    };
    if (c.quant.format == model::QuantFormat::kMxfp4) {
      // (Slices off the 32-value blocks hold whole blocks: padded below.)
      if (c.IsMoe() && c.moe.expert_intermediate % model::kMxfp4Block != 0)
        return InvalidArgument(tp + "expert intermediate size " +
                               std::to_string(c.moe.expert_intermediate) +
                               " (the input of mlp.experts.down_proj) is not whole MXFP4 blocks "
                               "of 32");
    } else {
      // fp8: the kernels read a rank's columns (and, for block scales,
      // each scale block's) in whole 16-byte loads.
      const bool block = c.quant.format == model::QuantFormat::kFp8Block;
      auto columns = [&](const std::string& tensor, int64_t slice) -> Status {
        const int64_t b = block ? TpCutBlock(c.quant.block_cols, 0, slice, 0, 1) : slice;
        if (b % kTpQuantColumns == 0) return Status::Ok();
        const std::string what =
            block ? "fp8 blocks of " + std::to_string(c.quant.block_cols) +
                        " columns cut into slices of " + std::to_string(slice) +
                        " columns leave scale blocks of " + std::to_string(b) + " columns"
                  : "fp8 columns cut into slices of " + std::to_string(slice);
        return InvalidArgument(tp + tensor + ": " + what + ", not a multiple of " +
                               std::to_string(kTpQuantColumns) +
                               " (the quantized kernels' 16-byte loads)");
      };
      if (covered("self_attn.o_proj"))
        RETURN_IF_ERROR(columns("model.layers.*.self_attn.o_proj.weight", qrows));
      if (dense_mlp && covered("mlp.down_proj"))
        RETURN_IF_ERROR(
            columns("model.layers.*.mlp.down_proj.weight", c.intermediate_size / degree));
      if (c.IsMoe() && covered("mlp.experts"))
        RETURN_IF_ERROR(columns("model.layers.*.mlp.experts.*.down_proj.weight",
                                c.moe.expert_intermediate / degree));
    }
  }
  const int64_t qh = c.num_heads / degree;
  const int64_t kvh = p.kv_replicas > 1 ? 1 : c.num_kv_heads / degree;
  const int64_t inter = dense_mlp ? c.intermediate_size / degree : 0;
  const int64_t einter = c.IsMoe() ? c.moe.expert_intermediate / degree : 0;
  // MXFP4 experts whose slices cut a 32-value block: each rank holds the
  // whole blocks around its slice, as many on every rank (the widest),
  // zero-padded past the last column; the columns it does not own are
  // zeroed in its down projection, so the sum over ranks is exact.
  const bool mx_pad = c.IsMoe() && c.quant.quantized() &&
                      c.quant.format == model::QuantFormat::kMxfp4 &&
                      einter % model::kMxfp4Block != 0;
  int64_t held = einter;
  if (mx_pad) {
    held = 0;
    for (int r = 0; r < degree; ++r) {
      const int64_t b = r * einter / model::kMxfp4Block * model::kMxfp4Block;
      const int64_t e =
          ((r + 1) * einter + model::kMxfp4Block - 1) / model::kMxfp4Block * model::kMxfp4Block;
      held = std::max(held, e - b);
    }
  }
  const int64_t vper = (c.vocab_size + degree - 1) / degree;
  for (int r = 0; r < degree; ++r) {
    TpRank k;
    k.rank = r;
    k.q_heads = {r * qh, qh};
    k.kv_heads = p.kv_replicas > 1 ? TpRange{r / p.kv_replicas, 1} : TpRange{r * kvh, kvh};
    k.primary_kv = r % p.kv_replicas == 0;
    k.intermediate = {r * inter, inter};
    k.expert_intermediate = {r * einter, einter};
    k.expert_held = k.expert_intermediate;
    if (mx_pad) k.expert_held = {r * einter / model::kMxfp4Block * model::kMxfp4Block, held};
    const int64_t vb = std::min<int64_t>(r * vper, c.vocab_size);
    k.vocab = {vb, std::min<int64_t>(vper, c.vocab_size - vb)};
    k.adds_row_biases = r == 0;
    p.ranks.push_back(k);
  }
  if (p.ranks.back().vocab.size <= 0)
    return InvalidArgument(tp + "vocabulary " + std::to_string(c.vocab_size) +
                           " leaves the last rank no rows");
  return p;
}

model::ModelConfig TpPlan::RankConfig(const model::ModelConfig& config, int rank) const {
  const TpRank& k = ranks.at(rank);
  model::ModelConfig c = config;
  c.num_heads = static_cast<int>(k.q_heads.size);
  c.num_kv_heads = static_cast<int>(k.kv_heads.size);
  if (k.intermediate.size > 0) c.intermediate_size = static_cast<int>(k.intermediate.size);
  if (c.IsMoe()) c.moe.expert_intermediate = static_cast<int>(k.expert_held.size);
  c.vocab_size = static_cast<int>(k.vocab.size);
  return c;
}

TensorCut TpPlan::CutOf(const model::ModelConfig& c, const std::string& name, int rank) const {
  const TpRank& k = ranks.at(rank);
  const int64_t D = c.head_dim;
  if (degree == 1) return {};
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return Slice(0, k.vocab.begin, k.vocab.size);
  if (Contains(name, ".self_attn.")) {
    if (EndsWith(name, "q_proj.weight") || EndsWith(name, "q_proj.bias"))
      return Slice(0, k.q_heads.begin * D, k.q_heads.size * D);
    if (EndsWith(name, "k_proj.weight") || EndsWith(name, "k_proj.bias") ||
        EndsWith(name, "v_proj.weight") || EndsWith(name, "v_proj.bias"))
      return Slice(0, k.kv_heads.begin * D, k.kv_heads.size * D);
    if (EndsWith(name, "o_proj.weight")) return Slice(1, k.q_heads.begin * D, k.q_heads.size * D);
    if (EndsWith(name, "o_proj.bias"))
      return k.adds_row_biases ? TensorCut{} : TensorCut{TensorCut::Kind::kZero};
    if (EndsWith(name, "self_attn.sinks")) return Slice(0, k.q_heads.begin, k.q_heads.size);
    return {};  // q_norm, k_norm
  }
  if (!Contains(name, ".mlp.")) return {};  // norms
  // The held columns, and (padded MXFP4) the owned ones the down
  // projection keeps.
  const TpRange& e = k.expert_held;
  const TpRange& own = k.expert_intermediate;
  auto keep = [&](TensorCut t, int64_t scale) {
    if (e == own) return t;
    t.keep_begin = scale * own.begin;
    t.keep_end = scale * own.end();
    return t;
  };
  if (Contains(name, ".mlp.experts.")) {
    // GPT-OSS's fused tensors: gate_up [E, H, 2I] with gate and up
    // interleaved along the last dimension (a pair per intermediate
    // column, so a column range is a contiguous range of pairs), as MXFP4
    // [E, 2I, H/32, 16] / [E, 2I, H/32]; down [E, I, H], as MXFP4
    // [E, H, I/32, 16] / [E, H, I/32].
    // Qwen3-MoE's fused tensors (TpFusedExpertShapes): gate_up [E, 2I, H]
    // as gate rows then up rows, down [E, H, I].
    const bool oss = c.arch == model::Architecture::kGptOss;
    if (EndsWith(name, "experts.gate_up_proj"))
      return oss ? Slice(2, 2 * e.begin, 2 * e.size) : Slice(1, e.begin, e.size, /*parts=*/2);
    if (EndsWith(name, "experts.gate_up_proj_blocks") ||
        EndsWith(name, "experts.gate_up_proj_scales") ||
        EndsWith(name, "experts.gate_up_proj_bias"))
      return Slice(1, 2 * e.begin, 2 * e.size);
    if (EndsWith(name, "experts.down_proj")) return keep(Slice(oss ? 1 : 2, e.begin, e.size), 1);
    if (EndsWith(name, "experts.down_proj_blocks") || EndsWith(name, "experts.down_proj_scales"))
      return Slice(2, e.begin / model::kMxfp4Block, e.size / model::kMxfp4Block);
    if (EndsWith(name, "experts.down_proj_bias"))
      return k.adds_row_biases ? TensorCut{} : TensorCut{TensorCut::Kind::kZero};
    // Qwen3-MoE: experts.<e>.{gate,up}_proj [I, H], down_proj [H, I].
    if (EndsWith(name, "gate_proj.weight") || EndsWith(name, "up_proj.weight"))
      return Slice(0, e.begin, e.size);
    if (EndsWith(name, "down_proj.weight")) return Slice(1, e.begin, e.size);
    return {};
  }
  const TpRange& i = k.intermediate;
  if (EndsWith(name, "mlp.gate_proj.weight") || EndsWith(name, "mlp.up_proj.weight"))
    return Slice(0, i.begin, i.size);
  if (EndsWith(name, "mlp.down_proj.weight")) return Slice(1, i.begin, i.size);
  return {};  // routers
}

TensorCut TpPlan::QuantCutOf(const model::ModelConfig& c, const std::string& name, int rank) const {
  if (degree > 1 && c.arch == model::Architecture::kGptOss && Contains(name, ".mlp.experts.")) {
    // [E, 2I, H] with gate and up rows interleaved (a pair per
    // intermediate column), and [E, H, I].
    TensorCut t = CutOf(c, name, rank);
    if (EndsWith(name, "experts.gate_up_proj") || EndsWith(name, "experts.down_proj"))
      t.dim = t.dim == 2 ? 1 : 2;  // [E, in, out] -> [E, out, in]
    return t;
  }
  return CutOf(c, name, rank);
}

std::vector<int64_t> CutShape(std::span<const int64_t> shape, const TensorCut& cut) {
  std::vector<int64_t> s(shape.begin(), shape.end());
  if (cut.kind == TensorCut::Kind::kSlice) s.at(cut.dim) = cut.size * cut.parts;
  return s;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> TpFusedExpertShapes(
    const model::ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (c.arch != model::Architecture::kQwen3Moe) return out;
  const int64_t e = c.moe.num_experts, i = c.moe.expert_intermediate, h = c.hidden_size;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    out.push_back({p + "gate_up_proj", {e, 2 * i, h}});
    out.push_back({p + "down_proj", {e, h, i}});
  }
  return out;
}

std::vector<TpKvRun> TpKvRuns(const cache::ModelCacheSpec& spec, const TpPlan& plan, int rank,
                              int group, int block_size) {
  const TpRank& k = plan.ranks.at(rank);
  const bool fp8 = spec.kv_dtype == cache::KvDtype::kFP8E4M3;
  const size_t e = cache::KvDtypeBytes(spec.kv_dtype);
  const size_t D = static_cast<size_t>(spec.head_dim);
  const size_t nkv = static_cast<size_t>(spec.num_kv_heads);
  const size_t nr = static_cast<size_t>(k.kv_heads.size);
  const size_t h0 = static_cast<size_t>(k.kv_heads.begin);
  const size_t bs = static_cast<size_t>(block_size);
  const size_t layers = spec.groups.at(group).layers.size();
  // Per section (K or V of one layer): [bs][heads][D] elements, then (fp8)
  // [bs][heads] f32 scales (kv_fp8.h).
  const size_t gsec = bs * nkv * (D * e + (fp8 ? 4 : 0));
  const size_t rsec = bs * nr * (D * e + (fp8 ? 4 : 0));
  std::vector<TpKvRun> runs;
  runs.reserve(layers * 2 * bs * (fp8 ? 2 : 1));
  for (size_t s = 0; s < layers * 2; ++s) {
    for (size_t t = 0; t < bs; ++t)
      runs.push_back({s * gsec + (t * nkv + h0) * D * e, s * rsec + t * nr * D * e, nr * D * e});
    if (!fp8) continue;
    const size_t gs = s * gsec + bs * nkv * D * e, rs = s * rsec + bs * nr * D * e;
    for (size_t t = 0; t < bs; ++t)
      runs.push_back({gs + (t * nkv + h0) * 4, rs + t * nr * 4, nr * 4});
  }
  return runs;
}

void TpMergeKvBlock(std::span<const TpKvRun> runs, std::span<const std::byte> rank_block,
                    std::span<std::byte> global_block) {
  for (const TpKvRun& r : runs)
    std::memcpy(global_block.data() + r.global_offset, rank_block.data() + r.rank_offset, r.bytes);
}

void TpSplitKvBlock(std::span<const TpKvRun> runs, std::span<const std::byte> global_block,
                    std::span<std::byte> rank_block) {
  for (const TpKvRun& r : runs)
    std::memcpy(rank_block.data() + r.rank_offset, global_block.data() + r.global_offset, r.bytes);
}

}  // namespace agentkv::backend
