#include "engine/model/quant_config.h"

#include <nlohmann/json.hpp>
#include <regex>

namespace agentkv::model {
namespace {

using nlohmann::json;

Status Bad(const std::string& source, const std::string& field, const std::string& why) {
  return InvalidArgument(source + ": field quantization_config." + field + " " + why);
}

Status ReadList(const json& q, const char* key, const std::string& source,
                std::vector<std::string>* out) {
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Bad(source, key, "must be a list of strings");
  for (const json& e : *it) {
    if (!e.is_string()) return Bad(source, key, "must be a list of strings");
    out->push_back(e.get<std::string>());
  }
  return Status::Ok();
}

Status ReadBlock(const json& v, const std::string& source, const std::string& field,
                 QuantConfig* c) {
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
      v[0].get<int64_t>() <= 0 || v[1].get<int64_t>() <= 0 || v[0].get<int64_t>() > (1 << 20) ||
      v[1].get<int64_t>() > (1 << 20))
    return Bad(source, field, "must be two positive integers, e.g. [128, 128]");
  c->block_rows = v[0].get<int>();
  c->block_cols = v[1].get<int>();
  return Status::Ok();
}

Status ParseCompressed(const json& q, const std::string& source, QuantConfig* c) {
  if (auto f = q.find("format"); f != q.end() && f->is_string()) {
    const std::string fmt = f->get<std::string>();
    if (fmt != "float-quantized" && fmt != "naive-quantized")
      return Bad(source, "format",
                 "\"" + fmt + "\" is not supported (FP8 weights: float-quantized)");
  }
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty())
    return Bad(source, "config_groups", "is missing or empty");
  bool first = true;
  for (auto g = groups->begin(); g != groups->end(); ++g) {
    const std::string field = "config_groups." + g.key() + ".weights";
    if (!g->is_object() || !g->contains("weights") || !(*g)["weights"].is_object())
      return Bad(source, field, "is missing");
    const json& w = (*g)["weights"];
    const int bits = w.value("num_bits", 0);
    const std::string type = w.value("type", "");
    if (bits != 8 || type != "float")
      return Bad(source, field,
                 "is " + std::to_string(bits) + "-bit " + type +
                     "; only 8-bit float (FP8) weights are supported");
    const std::string strategy = w.value("strategy", "tensor");
    QuantFormat f;
    if (strategy == "channel") {
      f = QuantFormat::kFp8Channel;
    } else if (strategy == "tensor") {
      f = QuantFormat::kFp8Tensor;
    } else if (strategy == "block") {
      f = QuantFormat::kFp8Block;
      auto bs = w.find("block_structure");
      if (bs == w.end()) return Bad(source, field + ".block_structure", "is missing");
      RETURN_IF_ERROR(ReadBlock(*bs, source, field + ".block_structure", c));
    } else {
      return Bad(source, field + ".strategy",
                 "\"" + strategy + "\" is not supported (channel, tensor or block)");
    }
    if (!first && f != c->format)
      return Bad(source, "config_groups", "mix weight strategies; one is supported");
    c->format = f;
    first = false;
  }
  return ReadList(q, "ignore", source, &c->not_converted);
}

}  // namespace

std::string_view QuantMethodName(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kMxfp4:
      return "mxfp4";
    case QuantMethod::kFp8:
      return "fp8";
    case QuantMethod::kCompressedTensors:
      return "compressed-tensors";
  }
  return "none";
}

bool QuantConfig::Covers(const std::string& name) const {
  if (!quantized()) return false;
  for (const std::string& m : not_converted) {
    if (method == QuantMethod::kCompressedTensors) {
      if (m.rfind("re:", 0) == 0) {
        try {
          if (std::regex_search(name, std::regex(m.substr(3)),
                                std::regex_constants::match_continuous))
            return false;
        } catch (const std::regex_error&) {
          // A pattern std::regex cannot read excludes nothing; what the
          // checkpoint stores still decides what loads quantized.
        }
      } else if (m == name) {
        return false;
      }
    } else if (name.find(m) != std::string::npos) {
      return false;
    }
  }
  return true;
}

Result<QuantConfig> ParseQuantConfig(const json& config, const std::string& source) {
  QuantConfig c;
  if (!config.is_object()) return c;
  auto it = config.find("quantization_config");
  std::string key = "quantization_config";
  if (it == config.end() || it->is_null()) {
    it = config.find("compression_config");
    key = "compression_config";
  }
  if (it == config.end() || it->is_null()) return c;
  if (!it->is_object()) return InvalidArgument(source + ": field " + key + " is not an object");
  const json& q = *it;
  auto m = q.find("quant_method");
  std::string method;
  if (m != q.end() && m->is_string()) {
    method = m->get<std::string>();
  } else if (key == "compression_config") {
    method = "compressed-tensors";
  } else {
    return Bad(source, "quant_method", "is missing");
  }
  if (method == "mxfp4") {
    c.method = QuantMethod::kMxfp4;
    c.format = QuantFormat::kMxfp4;
    RETURN_IF_ERROR(ReadList(q, "modules_to_not_convert", source, &c.not_converted));
    return c;
  }
  if (method == "fp8") {
    c.method = QuantMethod::kFp8;
    c.format = QuantFormat::kFp8Block;
    if (auto f = q.find("fmt"); f != q.end() && !f->is_null()) {
      if (!f->is_string() || f->get<std::string>() != "e4m3")
        return Bad(source, "fmt", "must be \"e4m3\" (got " + f->dump() + ")");
    }
    auto bs = q.find("weight_block_size");
    if (bs == q.end() || bs->is_null())
      return Bad(source, "weight_block_size",
                 "is missing (per-tensor fp8 checkpoints are not supported)");
    RETURN_IF_ERROR(ReadBlock(*bs, source, "weight_block_size", &c));
    RETURN_IF_ERROR(ReadList(q, "modules_to_not_convert", source, &c.not_converted));
    return c;
  }
  if (method == "compressed-tensors") {
    c.method = QuantMethod::kCompressedTensors;
    RETURN_IF_ERROR(ParseCompressed(q, source, &c));
    return c;
  }
  return Bad(source, "quant_method",
             "\"" + method + "\" is not supported (mxfp4, fp8, compressed-tensors)");
}

}  // namespace agentkv::model
