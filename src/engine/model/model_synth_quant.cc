#include "engine/model/model_synth_quant.h"

#include <algorithm>

#include "engine/model/quant_pack.h"

namespace agentkv::model {
namespace {

constexpr int kBlock = 128;  // fp8 block size written (Qwen3-FP8, DeepSeek)

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> WithTail(const std::vector<int64_t>& shape, std::vector<int64_t> tail) {
  std::vector<int64_t> s(shape.begin(), shape.end() - 2);
  s.insert(s.end(), tail.begin(), tail.end());
  return s;
}

}  // namespace

Result<SynthQuant> ParseSynthQuant(std::string_view name) {
  if (name.empty() || name == "none") return SynthQuant::kNone;
  if (name == "fp8") return SynthQuant::kFp8;
  if (name == "fp8-channel") return SynthQuant::kFp8Channel;
  if (name == "mxfp4") return SynthQuant::kMxfp4;
  return InvalidArgument("--quant: unknown format \"" + std::string(name) +
                         "\" (one of none, fp8, fp8-channel, mxfp4)");
}

Status CheckSynthQuant(SynthQuant q, const std::string& arch) {
  if (q == SynthQuant::kMxfp4 && arch != "gpt_oss")
    return InvalidArgument(
        "--quant mxfp4: only gpt_oss checkpoints store weights (their "
        "experts) in MXFP4; use fp8 or fp8-channel for --arch " +
        arch);
  return Status::Ok();
}

nlohmann::ordered_json SynthQuantConfig(SynthQuant q) {
  nlohmann::ordered_json c;
  switch (q) {
    case SynthQuant::kNone:
      break;
    case SynthQuant::kFp8:
      c["activation_scheme"] = "dynamic";
      c["fmt"] = "e4m3";
      c["quant_method"] = "fp8";
      c["weight_block_size"] = {kBlock, kBlock};
      break;
    case SynthQuant::kFp8Channel: {
      nlohmann::ordered_json weights = {{"num_bits", 8},
                                        {"type", "float"},
                                        {"strategy", "channel"},
                                        {"dynamic", false},
                                        {"symmetric", true},
                                        {"group_size", nullptr},
                                        {"block_structure", nullptr},
                                        {"observer", "minmax"}};
      nlohmann::ordered_json input = {{"num_bits", 8},       {"type", "float"},
                                      {"strategy", "token"}, {"dynamic", true},
                                      {"symmetric", true},   {"observer", nullptr}};
      c["config_groups"]["group_0"] = {{"targets", {"Linear"}},
                                       {"weights", weights},
                                       {"input_activations", input},
                                       {"output_activations", nullptr}};
      c["format"] = "float-quantized";
      c["ignore"] = {"lm_head"};
      c["kv_cache_scheme"] = nullptr;
      c["quant_method"] = "compressed-tensors";
      c["quantization_status"] = "compressed";
      break;
    }
    case SynthQuant::kMxfp4:
      c["modules_to_not_convert"] = {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                     "model.embed_tokens", "lm_head"};
      c["quant_method"] = "mxfp4";
      break;
  }
  return c;
}

bool SynthQuantizes(SynthQuant q, const WeightSpec& w, QuantFormat* format) {
  if (q == SynthQuant::kNone || w.shape.size() < 2) return false;
  if (q == SynthQuant::kMxfp4) {
    *format = QuantFormat::kMxfp4;
    return EndsWith(w.name, "mlp.experts.gate_up_proj") ||
           EndsWith(w.name, "mlp.experts.down_proj");
  }
  // Linear layers and experts (Qwen3-MoE's per-expert projections); never
  // the router, embeddings, norms or the LM head.
  if ((w.role != WeightRole::kLinear && w.role != WeightRole::kExpert) ||
      w.name == "lm_head.weight")
    return false;
  for (std::string_view m : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                             "gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    if (EndsWith(w.name, m)) {
      *format = q == SynthQuant::kFp8 ? QuantFormat::kFp8Block : QuantFormat::kFp8Channel;
      return true;
    }
  }
  return false;
}

Status DeclareQuantized(SafetensorsWriter& writer, const std::string& name,
                        const std::vector<int64_t>& shape, QuantFormat format) {
  if (shape.size() < 2) return InvalidArgument(name + ": a quantized weight needs [.., out, in]");
  const int64_t out = shape[shape.size() - 2], in = shape.back();
  switch (format) {
    case QuantFormat::kFp8Block:
      RETURN_IF_ERROR(writer.Add(name, TensorDtype::kF8E4M3, shape));
      return writer.Add(name + "_scale_inv", TensorDtype::kF32,
                        WithTail(shape, {CeilDiv(out, kBlock), CeilDiv(in, kBlock)}));
    case QuantFormat::kFp8Channel:
      RETURN_IF_ERROR(writer.Add(name, TensorDtype::kF8E4M3, shape));
      return writer.Add(name + "_scale", TensorDtype::kF32, WithTail(shape, {out, 1}));
    case QuantFormat::kMxfp4:
      if (in % kMxfp4Block != 0)
        return InvalidArgument(name + ": MXFP4 needs input features in multiples of 32, not " +
                               std::to_string(in));
      RETURN_IF_ERROR(writer.Add(name + "_blocks", TensorDtype::kU8,
                                 WithTail(shape, {out, in / kMxfp4Block, kMxfp4Block / 2})));
      return writer.Add(name + "_scales", TensorDtype::kU8,
                        WithTail(shape, {out, in / kMxfp4Block}));
    case QuantFormat::kFp8Tensor:
      break;
  }
  return InvalidArgument(name + ": synth does not write " + std::string(QuantFormatName(format)));
}

Result<uint64_t> WriteQuantized(SafetensorsWriter& writer, const std::vector<int64_t>& shape,
                                QuantFormat format, const SynthValues& values) {
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) batch *= shape[i];
  const int64_t slab = format == QuantFormat::kFp8Block ? kBlock : 64;
  std::vector<float> f(static_cast<size_t>(slab * cols));
  std::vector<uint8_t> codes(static_cast<size_t>(slab * cols));
  std::vector<float> scales;  // fp8, all of them: written after the codes
  std::vector<uint8_t> exps;  // mxfp4 likewise
  uint64_t bytes = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r0 = 0; r0 < rows; r0 += slab) {
      const int64_t nr = std::min(slab, rows - r0);
      values(static_cast<uint64_t>((b * rows + r0) * cols), static_cast<uint64_t>(nr * cols),
             f.data());
      size_t n = 0;
      switch (format) {
        case QuantFormat::kFp8Block: {
          const size_t at = scales.size();
          scales.resize(at + CeilDiv(cols, kBlock));
          PackFp8Block(f.data(), nr, cols, kBlock, kBlock, codes.data(), scales.data() + at);
          n = nr * cols;
          break;
        }
        case QuantFormat::kFp8Channel: {
          const size_t at = scales.size();
          scales.resize(at + nr);
          PackFp8Channel(f.data(), nr, cols, codes.data(), scales.data() + at);
          n = nr * cols;
          break;
        }
        case QuantFormat::kMxfp4: {
          const size_t at = exps.size();
          exps.resize(at + nr * (cols / kMxfp4Block));
          PackMxfp4(f.data(), nr, cols, codes.data(), exps.data() + at);
          n = nr * cols / 2;
          break;
        }
        case QuantFormat::kFp8Tensor:
          return InvalidArgument("synth does not write fp8-tensor weights");
      }
      RETURN_IF_ERROR(writer.Append(codes.data(), n));
      bytes += n;
    }
  }
  if (format == QuantFormat::kMxfp4) {
    RETURN_IF_ERROR(writer.Append(exps.data(), exps.size()));
    return bytes + exps.size();
  }
  RETURN_IF_ERROR(writer.Append(scales.data(), scales.size() * sizeof(float)));
  return bytes + scales.size() * sizeof(float);
}

}  // namespace agentkv::model
