// WeightSource: where a backend gets its weights from, by Hugging Face tensor
// name. Decouples the backends from the file format (safetensors checkpoint,
// or tensors made in memory by tests).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace agentkv {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  // The tensor converted to fp32. Errors (missing, wrong shape, unsupported
  // dtype) name the file and the tensor.
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
};

}  // namespace agentkv
