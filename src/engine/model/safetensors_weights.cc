#include "engine/model/safetensors_weights.h"

#include <cstring>

#include "util/bf16.h"

namespace agentkv {

Result<SafetensorsWeights> SafetensorsWeights::Open(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(Safetensors st, Safetensors::Open(path));
  return SafetensorsWeights(std::move(st));
}

Result<std::vector<float>> SafetensorsWeights::LoadF32(const std::string& name,
                                                       std::span<const int64_t> shape) const {
  if (!st_.Has(name)) {
    return NotFound("tensor " + name + " is missing from the checkpoint");
  }
  ASSIGN_OR_RETURN(TensorView t, st_.Get(name, std::vector<int64_t>(shape.begin(), shape.end())));
  const int64_t n = t.numel();
  std::vector<float> out(n);
  const auto* bytes = static_cast<const unsigned char*>(t.data);
  switch (t.dtype) {
    case TensorDtype::kF32:
      std::memcpy(out.data(), bytes, n * sizeof(float));
      break;
    case TensorDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = Bf16ToF32(h);
      }
      break;
    case TensorDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = F16ToF32(h);
      }
      break;
  }
  return out;
}

Result<std::vector<uint16_t>> SafetensorsWeights::LoadBf16IfStored(
    const std::string& name, std::span<const int64_t> shape) const {
  if (!st_.Has(name)) return NotFound("tensor " + name + " is missing from the checkpoint");
  ASSIGN_OR_RETURN(TensorView t, st_.Get(name, std::vector<int64_t>(shape.begin(), shape.end())));
  if (t.dtype != TensorDtype::kBF16) return Unimplemented(name + " is not stored as bf16");
  std::vector<uint16_t> out(t.numel());
  std::memcpy(out.data(), t.data, out.size() * 2);
  return out;
}

}  // namespace agentkv
