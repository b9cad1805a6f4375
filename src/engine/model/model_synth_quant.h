// `agentkv model synth --quant`: how a synthesized checkpoint stores its
// quantized weights, the way published checkpoints do.
//   fp8          FP8 e4m3, 128x128 block scales: `X.weight` F8_E4M3 and
//                `X.weight_scale_inv` F32 (Qwen3-*-FP8);
//                quantization_config {quant_method: fp8, fmt: e4m3,
//                weight_block_size: [128, 128], activation_scheme: dynamic}.
//   fp8-channel  compressed-tensors FP8 with per-channel scales: `X.weight`
//                F8_E4M3 and `X.weight_scale` F32 [out, 1]; ignore: [lm_head].
//   mxfp4        GPT-OSS experts (`*_blocks` / `*_scales`); quant_method mxfp4.
// Dense linear layers (q/k/v/o, gate/up/down) and Qwen3-MoE's per-expert
// projections are quantized under fp8 and fp8-channel; embeddings, norms,
// biases, MoE routers and the LM head stay in the checkpoint's float dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/quant_format.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model/weight_spec.h"
#include "util/status.h"

namespace agentkv::model {

enum class SynthQuant { kNone, kFp8, kFp8Channel, kMxfp4 };

// "" or "none", "fp8", "fp8-channel", "mxfp4"; anything else InvalidArgument.
Result<SynthQuant> ParseSynthQuant(std::string_view name);
// InvalidArgument (naming --quant) unless `arch` can be stored so: mxfp4
// only for gpt_oss (its experts).
Status CheckSynthQuant(SynthQuant q, const std::string& arch);
// config.json's quantization_config for `q` (not kNone).
nlohmann::ordered_json SynthQuantConfig(SynthQuant q);
// The stored format of weight `w` under `q`, or false if it stays a float
// tensor.
bool SynthQuantizes(SynthQuant q, const WeightSpec& w, QuantFormat* format);

// Fills `count` fp32 values of a weight, in its logical [.., out, in]
// element order, from element `first` on.
using SynthValues = std::function<void(uint64_t first, uint64_t count, float* out)>;

// Declares on `writer` the tensors that weight `name` of logical shape
// [.., out, in] becomes in `format`: fp8-block `name` + `name`_scale_inv,
// fp8-channel `name` + `name`_scale, mxfp4 `name`_blocks + `name`_scales.
Status DeclareQuantized(SafetensorsWriter& writer, const std::string& name,
                        const std::vector<int64_t>& shape, QuantFormat format);
// Appends those tensors' bytes (after DeclareQuantized and Begin, in
// declaration order), packing `values` a slab of rows at a time so memory
// stays small. Returns the bytes appended.
Result<uint64_t> WriteQuantized(SafetensorsWriter& writer, const std::vector<int64_t>& shape,
                                QuantFormat format, const SynthValues& values);

}  // namespace agentkv::model
