#include "engine/backend/tp_plan.h"

#include <algorithm>
#include <cstring>

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
    // A slice must not cut a quantization block: MXFP4 blocks of 32 inputs
    // (the experts' down projection takes its input split); fp8 blocks of
    // block_rows x block_cols (every split dimension). Per-channel and
    // per-tensor fp8 scales cut with their rows or not at all.
    const int64_t qrows = static_cast<int64_t>(c.num_heads / degree) * c.head_dim;
    const int64_t kvrows = static_cast<int64_t>(std::max(1, c.num_kv_heads / degree)) * c.head_dim;
    if (c.quant.format == model::QuantFormat::kMxfp4) {
      if (c.IsMoe())
        RETURN_IF_ERROR(CheckSplit("expert intermediate size (MXFP4 blocks of 32)",
                                   c.moe.expert_intermediate, degree, model::kMxfp4Block));
    } else if (c.quant.format == model::QuantFormat::kFp8Block) {
      const int64_t b = std::max(c.quant.block_rows, c.quant.block_cols);
      RETURN_IF_ERROR(CheckSplit("query rows (fp8 blocks)", qrows * degree, degree, b));
      if (p.kv_replicas == 1)
        RETURN_IF_ERROR(CheckSplit("KV rows (fp8 blocks)", kvrows * degree, degree, b));
      if (dense_mlp)
        RETURN_IF_ERROR(
            CheckSplit("intermediate size (fp8 blocks)", c.intermediate_size, degree, b));
      if (c.IsMoe())
        RETURN_IF_ERROR(CheckSplit("expert intermediate size (fp8 blocks)",
                                   c.moe.expert_intermediate, degree, b));
    }
  }
  const int64_t qh = c.num_heads / degree;
  const int64_t kvh = p.kv_replicas > 1 ? 1 : c.num_kv_heads / degree;
  const int64_t inter = dense_mlp ? c.intermediate_size / degree : 0;
  const int64_t einter = c.IsMoe() ? c.moe.expert_intermediate / degree : 0;
  const int64_t vper = (c.vocab_size + degree - 1) / degree;
  for (int r = 0; r < degree; ++r) {
    TpRank k;
    k.rank = r;
    k.q_heads = {r * qh, qh};
    k.kv_heads = p.kv_replicas > 1 ? TpRange{r / p.kv_replicas, 1} : TpRange{r * kvh, kvh};
    k.primary_kv = r % p.kv_replicas == 0;
    k.intermediate = {r * inter, inter};
    k.expert_intermediate = {r * einter, einter};
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
  if (c.IsMoe()) c.moe.expert_intermediate = static_cast<int>(k.expert_intermediate.size);
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
  const TpRange& e = k.expert_intermediate;
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
    if (EndsWith(name, "experts.down_proj")) return Slice(oss ? 1 : 2, e.begin, e.size);
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
