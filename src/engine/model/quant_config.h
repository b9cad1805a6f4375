// QuantConfig: config.json's `quantization_config` (or the older
// `compression_config`), for the formats agentkv loads as published:
//   {"quant_method": "mxfp4", "modules_to_not_convert": [...]}          (GPT-OSS)
//   {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
//    "modules_to_not_convert": [...]}                                   (Qwen3-FP8, DeepSeek)
//   {"quant_method": "compressed-tensors", "format": "float-quantized",
//    "config_groups": {"group_0": {"targets": ["Linear"], "weights":
//      {"num_bits": 8, "type": "float", "strategy": "channel" | "tensor" |
//       "block", "block_structure": [128, 128]}}}, "ignore": [...]}
// Which tensors are quantized is what the checkpoint stores (an F8_E4M3
// weight, or `*_blocks` / `*_scales`); this says how to read them and which
// modules the lists exclude.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "engine/model/quant_format.h"
#include "util/status.h"

namespace agentkv::model {

enum class QuantMethod { kNone, kMxfp4, kFp8, kCompressedTensors };

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  // The format of a quantized linear weight: kMxfp4 for mxfp4, kFp8Block for
  // fp8, the weights' strategy for compressed-tensors.
  QuantFormat format = QuantFormat::kFp8Block;
  int block_rows = 128, block_cols = 128;  // kFp8Block
  // modules_to_not_convert (matched as substrings of a module name, as
  // transformers does) or compressed-tensors' ignore (exact names, or "re:"
  // patterns matched from the start of the name).
  std::vector<std::string> not_converted;

  bool quantized() const { return method != QuantMethod::kNone; }
  // Whether the lists leave module `name` (e.g. "model.layers.0.mlp.down_proj",
  // "lm_head") to be quantized. False when not quantized.
  bool Covers(const std::string& name) const;

  bool operator==(const QuantConfig&) const = default;
};

// "none", "mxfp4", "fp8", "compressed-tensors".
std::string_view QuantMethodName(QuantMethod m);

// Reads `config` (the whole config.json object). No quantization_config (or
// null) gives method kNone. An unknown quant_method, an fp8 fmt other than
// e4m3, a bad weight_block_size, or a compressed-tensors scheme other than
// 8-bit float weights is InvalidArgument naming `source` and the field.
Result<QuantConfig> ParseQuantConfig(const nlohmann::json& config, const std::string& source);

}  // namespace agentkv::model
