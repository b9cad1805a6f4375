// TpWeightSource: one rank's view of a checkpoint under tensor parallelism
// (tp_plan.h). A backend built for TpPlan::RankConfig asks it for tensors
// by their usual names at its (smaller) shapes; it loads the full tensor
// from the checkpoint and returns the rank's cut (TpPlan::CutOf), so the
// backend's loading code runs unchanged.
//
// Quantized weights (LoadQuantized) are cut likewise, their scales with
// them (TpPlan::QuantCutOf, TpCutQuantized): the full weight is loaded as
// stored and the rank keeps its slice of the codes and of the scales.
//
// Thread-safety: as the wrapped source (const calls only). Does not own
// `full`, which must outlive it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/backend/tp_plan.h"
#include "engine/model/weight_source.h"

namespace agentkv::backend {

class TpWeightSource final : public model::WeightSource {
 public:
  // `config`: the full model's; `plan`: made for it.
  TpWeightSource(const model::WeightSource& full, const model::ModelConfig& config,
                 const TpPlan& plan, int rank);

  bool Has(const std::string& name) const override { return full_.Has(name); }
  // `shape` must be the rank's shape of `name` (CutShape of the full
  // shape); InvalidArgument otherwise, or for a name the model does not
  // have (ExpectedWeights).
  Result<std::vector<float>> LoadF32(const std::string& name,
                                     std::span<const int64_t> shape) const override;
  Result<std::vector<uint16_t>> LoadBf16IfStored(const std::string& name,
                                                 std::span<const int64_t> shape) const override;
  bool IsQuantized(const std::string& name) const override;
  // `shape`: the rank's logical [.., out, in] shape of `name` (the cut of
  // the full logical shape); InvalidArgument otherwise, for a name the
  // model does not have, or for a cut its scales cannot follow
  // (TpCutQuantized).
  Result<model::QuantizedWeight> LoadQuantized(const std::string& name,
                                               std::span<const int64_t> shape,
                                               const model::QuantConfig& quant) const override;

 private:
  // The full shape of `name` and its cut, after checking `shape`.
  Result<std::pair<std::vector<int64_t>, TensorCut>> Resolve(const std::string& name,
                                                             std::span<const int64_t> shape) const;
  const model::WeightSource& full_;
  model::ModelConfig config_;
  TpPlan plan_;
  int rank_;
  std::map<std::string, std::vector<int64_t>> shapes_;  // model::ExpectedWeights of the full model
  // Logical [.., out, in] shapes of the full model's weights as
  // LoadQuantized names them, where they differ from shapes_ (GPT-OSS's
  // experts: [E, in, out] as floats; as MXFP4, `name`_blocks and _scales).
  std::map<std::string, std::vector<int64_t>> quant_shapes_;
};

}  // namespace agentkv::backend
