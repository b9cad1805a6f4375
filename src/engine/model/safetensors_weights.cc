#include "engine/model/safetensors_weights.h"

#include <cstring>

#include "util/bf16.h"

namespace agentkv::model {

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
    case TensorDtype::kU8:
    case TensorDtype::kF8E4M3:
      return InvalidArgument(st_.FileOf(name).string() + ": tensor " + name + " is stored as " +
                             std::string(TensorDtypeName(t.dtype)) +
                             " (quantized), not as a float type; read it with LoadQuantized");
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

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A scale tensor (F32, BF16 or F16) as fp32.
Result<std::vector<float>> ScalesF32(const Safetensors& st, const TensorView& t) {
  std::vector<float> out(t.numel());
  const auto* bytes = static_cast<const unsigned char*>(t.data);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == TensorDtype::kF32) {
      std::memcpy(&out[i], bytes + 4 * i, 4);
    } else if (t.dtype == TensorDtype::kBF16 || t.dtype == TensorDtype::kF16) {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      out[i] = t.dtype == TensorDtype::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
    } else {
      return InvalidArgument(st.FileOf(t.name).string() + ": tensor " + t.name + " has dtype " +
                             std::string(TensorDtypeName(t.dtype)) +
                             ", expected F32, BF16 or F16 scales");
    }
  }
  return out;
}

Result<TensorView> GetTyped(const Safetensors& st, const std::string& name,
                            const std::vector<int64_t>& shape, TensorDtype dtype) {
  if (!st.Has(name)) return NotFound("tensor " + name + " is missing from the checkpoint");
  ASSIGN_OR_RETURN(TensorView t, st.Get(name, shape));
  if (t.dtype != dtype)
    return InvalidArgument(st.FileOf(name).string() + ": tensor " + name + " has dtype " +
                           std::string(TensorDtypeName(t.dtype)) + ", expected " +
                           std::string(TensorDtypeName(dtype)));
  return t;
}

}  // namespace

bool SafetensorsWeights::IsQuantized(const std::string& name) const {
  if (st_.Has(name + "_blocks")) return true;
  if (!st_.Has(name)) return false;
  auto t = st_.Get(name);
  return t.ok() && t->dtype == TensorDtype::kF8E4M3;
}

Result<QuantizedWeight> SafetensorsWeights::LoadQuantized(const std::string& name,
                                                          std::span<const int64_t> shape,
                                                          const QuantConfig& quant) const {
  if (shape.size() < 2 || shape[shape.size() - 1] <= 0 || shape[shape.size() - 2] <= 0)
    return InvalidArgument(name + ": a quantized weight needs a [.., out, in] shape");
  QuantizedWeight w;
  w.shape.assign(shape.begin(), shape.end());
  w.cols = shape.back();
  w.rows = shape[shape.size() - 2];
  for (size_t i = 0; i + 2 < shape.size(); ++i) w.batch *= shape[i];
  const std::vector<int64_t> lead(shape.begin(), shape.end() - 2);
  auto with = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s = lead;
    s.insert(s.end(), tail);
    return s;
  };
  const std::string method(QuantMethodName(quant.method));

  if (st_.Has(name + "_blocks")) {
    if (quant.format != QuantFormat::kMxfp4 || quant.method == QuantMethod::kNone)
      return InvalidArgument(name + "_blocks: MXFP4 blocks, but config.json's " +
                             "quantization_config.quant_method is " + method + ", not mxfp4");
    if (w.cols % kMxfp4Block != 0)
      return InvalidArgument(name + ": " + std::to_string(w.cols) +
                             " input features are not a multiple of 32 (MXFP4)");
    const int64_t groups = w.cols / kMxfp4Block;
    ASSIGN_OR_RETURN(
        TensorView b,
        GetTyped(st_, name + "_blocks", with({w.rows, groups, kMxfp4Block / 2}), TensorDtype::kU8));
    ASSIGN_OR_RETURN(TensorView s,
                     GetTyped(st_, name + "_scales", with({w.rows, groups}), TensorDtype::kU8));
    w.format = QuantFormat::kMxfp4;
    const auto* bb = static_cast<const uint8_t*>(b.data);
    const auto* sb = static_cast<const uint8_t*>(s.data);
    w.codes.assign(bb, bb + b.nbytes);
    w.exponents.assign(sb, sb + s.nbytes);
    RETURN_IF_ERROR(w.Validate());
    return w;
  }

  if (!st_.Has(name)) return NotFound("tensor " + name + " is missing from the checkpoint");
  ASSIGN_OR_RETURN(TensorView t, st_.Get(name, w.shape));
  if (t.dtype != TensorDtype::kF8E4M3)
    return Unimplemented(st_.FileOf(name).string() + ": tensor " + name + " is stored as " +
                         std::string(TensorDtypeName(t.dtype)) + ", not quantized");
  std::string scale_name;
  std::vector<int64_t> scale_shape;
  if (quant.method == QuantMethod::kFp8) {
    w.format = QuantFormat::kFp8Block;
    scale_name = name + "_scale_inv";
  } else if (quant.method == QuantMethod::kCompressedTensors) {
    w.format = quant.format;
    scale_name = name + "_scale";
  } else {
    return InvalidArgument(st_.FileOf(name).string() + ": tensor " + name +
                           " is F8_E4M3 but config.json's quantization_config.quant_method is " +
                           method + " (expected fp8 or compressed-tensors)");
  }
  if (!st_.Has(scale_name))
    return NotFound("tensor " + scale_name + " (the scales of " + name +
                    ") is missing from the checkpoint");
  ASSIGN_OR_RETURN(TensorView s, st_.Get(scale_name));
  bool shape_ok = false;
  std::string want;
  switch (w.format) {
    case QuantFormat::kFp8Block:
      w.block_rows = quant.block_rows;
      w.block_cols = quant.block_cols;
      scale_shape = with({CeilDiv(w.rows, w.block_rows), CeilDiv(w.cols, w.block_cols)});
      shape_ok = s.shape == scale_shape;
      want = ShapeString(scale_shape);
      break;
    case QuantFormat::kFp8Channel:
      shape_ok = s.shape == with({w.rows, 1}) || s.shape == with({w.rows});
      want = ShapeString(with({w.rows, 1}));
      break;
    case QuantFormat::kFp8Tensor:
      // A single value: [] or [1] (per expert: the leading dimensions).
      shape_ok = s.numel() == w.batch;
      want = "one value per matrix";
      break;
    case QuantFormat::kMxfp4:
      return InvalidArgument(name + ": F8_E4M3 weight under an mxfp4 quantization_config");
  }
  if (!shape_ok)
    return InvalidArgument(st_.FileOf(scale_name).string() + ": tensor " + scale_name +
                           " has shape " + ShapeString(s.shape) + ", expected " + want);
  ASSIGN_OR_RETURN(w.scales, ScalesF32(st_, s));
  const auto* cb = static_cast<const uint8_t*>(t.data);
  w.codes.assign(cb, cb + t.nbytes);
  RETURN_IF_ERROR(w.Validate());
  return w;
}

}  // namespace agentkv::model
