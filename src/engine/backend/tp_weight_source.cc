#include "engine/backend/tp_weight_source.h"

#include "engine/backend/tp_quant_cut.h"
#include "engine/model/weight_spec.h"

namespace agentkv::backend {
namespace {

std::string ShapeText(std::span<const int64_t> s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

TpWeightSource::TpWeightSource(const model::WeightSource& full, const model::ModelConfig& config,
                               const TpPlan& plan, int rank)
    : full_(full), config_(config), plan_(plan), rank_(rank) {
  for (const model::WeightSpec& w : model::ExpectedWeights(config)) {
    shapes_[w.name] = w.shape;
    const std::string blocks = "_blocks";
    if (w.role == model::WeightRole::kExpertBlocks && w.shape.size() == 4 &&
        w.name.size() > blocks.size()) {
      // [E, out, in / 32, 16] blocks: the weight [E, out, in].
      quant_shapes_[w.name.substr(0, w.name.size() - blocks.size())] = {
          w.shape[0], w.shape[1], w.shape[2] * model::kMxfp4Block};
    } else if (config.arch == model::Architecture::kGptOss &&
               w.role == model::WeightRole::kExpert && w.shape.size() == 3) {
      quant_shapes_[w.name] = {w.shape[0], w.shape[2], w.shape[1]};
    }
  }
  for (auto& [name, shape] : TpFusedExpertShapes(config)) shapes_[name] = shape;
}

Result<std::pair<std::vector<int64_t>, TensorCut>> TpWeightSource::Resolve(
    const std::string& name, std::span<const int64_t> shape) const {
  auto it = shapes_.find(name);
  if (it == shapes_.end())
    return InvalidArgument("tensor parallel: " + name + " is not a tensor of this model");
  const TensorCut cut = plan_.CutOf(config_, name, rank_);
  const std::vector<int64_t> want = CutShape(it->second, cut);
  if (!std::equal(want.begin(), want.end(), shape.begin(), shape.end()))
    return InvalidArgument("tensor parallel: rank " + std::to_string(rank_) + " asked for " + name +
                           " as " + ShapeText(shape) + ", its slice is " + ShapeText(want));
  return std::pair{it->second, cut};
}

Result<std::vector<float>> TpWeightSource::LoadF32(const std::string& name,
                                                   std::span<const int64_t> shape) const {
  ASSIGN_OR_RETURN(auto r, Resolve(name, shape));
  ASSIGN_OR_RETURN(std::vector<float> f, full_.LoadF32(name, r.first));
  return CutTensor<float>(f, r.first, r.second);
}

Result<std::vector<uint16_t>> TpWeightSource::LoadBf16IfStored(
    const std::string& name, std::span<const int64_t> shape) const {
  ASSIGN_OR_RETURN(auto r, Resolve(name, shape));
  ASSIGN_OR_RETURN(std::vector<uint16_t> b, full_.LoadBf16IfStored(name, r.first));
  return CutTensor<uint16_t>(b, r.first, r.second);
}

bool TpWeightSource::IsQuantized(const std::string& name) const { return full_.IsQuantized(name); }

Result<model::QuantizedWeight> TpWeightSource::LoadQuantized(
    const std::string& name, std::span<const int64_t> shape,
    const model::QuantConfig& quant) const {
  if (plan_.degree == 1) return full_.LoadQuantized(name, shape, quant);
  const std::vector<int64_t>* found = nullptr;
  if (auto q = quant_shapes_.find(name); q != quant_shapes_.end()) {
    found = &q->second;
  } else if (auto f = shapes_.find(name); f != shapes_.end()) {
    found = &f->second;
  } else {
    return InvalidArgument("tensor parallel: " + name + " is not a tensor of this model");
  }
  const std::vector<int64_t>& full = *found;
  const TensorCut cut = plan_.QuantCutOf(config_, name, rank_);
  const std::vector<int64_t> want = CutShape(full, cut);
  if (!std::equal(want.begin(), want.end(), shape.begin(), shape.end()))
    return InvalidArgument("tensor parallel: rank " + std::to_string(rank_) + " asked for " + name +
                           " (quantized) as " + ShapeText(shape) + ", its slice is " +
                           ShapeText(want));
  ASSIGN_OR_RETURN(model::QuantizedWeight w, full_.LoadQuantized(name, full, quant));
  return TpCutQuantized(w, cut, name);
}

}  // namespace agentkv::backend
