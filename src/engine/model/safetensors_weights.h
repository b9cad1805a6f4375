// SafetensorsWeights: a WeightSource over a checkpoint's safetensors files;
// tensors are converted from bf16, fp16 or fp32 to fp32 on request, and
// quantized linear weights (F8_E4M3 with their scales, MXFP4 blocks and
// scales) are handed out as stored (engine/model/quant_format.h).
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <filesystem>

#include "engine/model/safetensors.h"
#include "engine/model/weight_source.h"

namespace agentkv::model {

class SafetensorsWeights final : public WeightSource {
 public:
  // `path` as Safetensors::Open: a file, an index, or a checkpoint directory.
  static Result<SafetensorsWeights> Open(const std::filesystem::path& path);

  bool Has(const std::string& name) const override { return st_.Has(name); }
  Result<std::vector<float>> LoadF32(const std::string& name,
                                     std::span<const int64_t> shape) const override;
  Result<std::vector<uint16_t>> LoadBf16IfStored(const std::string& name,
                                                 std::span<const int64_t> shape) const override;
  bool IsQuantized(const std::string& name) const override;
  Result<QuantizedWeight> LoadQuantized(const std::string& name, std::span<const int64_t> shape,
                                        const QuantConfig& quant) const override;
  const Safetensors& safetensors() const { return st_; }

 private:
  explicit SafetensorsWeights(Safetensors st) : st_(std::move(st)) {}
  Safetensors st_;
};

}  // namespace agentkv::model
