#include "engine/backend/tp_weight_source.h"

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
  for (const model::WeightSpec& w : model::ExpectedWeights(config)) shapes_[w.name] = w.shape;
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
  return Unimplemented("tensor parallel: quantized weights (" + name +
                       ") are not split across GPUs yet");
}

}  // namespace agentkv::backend
