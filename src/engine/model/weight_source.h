// WeightSource: where a backend gets its weights from, by Hugging Face tensor
// name. Decouples the backends from the file format (safetensors checkpoint,
// or tensors made in memory by tests).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/model/quant_config.h"
#include "engine/model/quant_format.h"
#include "util/status.h"

namespace agentkv::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  // The tensor converted to fp32. Errors (missing, wrong shape, unsupported
  // dtype, a quantized tensor) name the file and the tensor.
  virtual Result<std::vector<float>> LoadF32(const std::string& name,
                                             std::span<const int64_t> shape) const = 0;
  // The tensor's raw bf16 values if it is stored as bf16 (so keeping it in
  // bf16 loses nothing); Unimplemented otherwise.
  virtual Result<std::vector<uint16_t>> LoadBf16IfStored(const std::string& name,
                                                         std::span<const int64_t> shape) const {
    (void)name;
    (void)shape;
    return Unimplemented("bf16 storage not available");
  }

  // Quantized linear weights. `name` is the weight's unquantized tensor name
  // ("model.layers.0.self_attn.q_proj.weight", or for GPT-OSS's experts
  // "model.layers.0.mlp.experts.gate_up_proj") and `shape` its logical
  // [.., out, in] shape.
  // Whether the checkpoint stores `name` quantized: as an F8_E4M3 tensor, or
  // as `name`_blocks / `name`_scales (MXFP4).
  virtual bool IsQuantized(const std::string& name) const {
    (void)name;
    return false;
  }
  // The weight as stored, not converted (codes and scales copied out of the
  // checkpoint), read as `quant` says. Errors: not stored quantized, a
  // config that does not say how (no quantization_config), scales or
  // blocks missing or of the wrong shape or dtype; each names the tensor.
  virtual Result<QuantizedWeight> LoadQuantized(const std::string& name,
                                                std::span<const int64_t> shape,
                                                const QuantConfig& quant) const {
    (void)shape;
    (void)quant;
    return Unimplemented(name + ": this weight source holds no quantized weights");
  }
};

}  // namespace agentkv::model
