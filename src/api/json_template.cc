#include "api/json_template.h"

#include <nlohmann/json.hpp>

namespace agentkv::api {

JsonTemplate::JsonTemplate(std::string_view before, std::string_view dumped,
                           std::string_view after) {
  const std::string hole = std::string("\"") + kHole + "\"";
  const size_t at = dumped.find(hole);
  prefix_ = std::string(before);
  if (at == std::string_view::npos) {
    // No hole: a document without text (misuse); render it unchanged.
    prefix_ += std::string(dumped);
    suffix_ = std::string(after);
    return;
  }
  has_hole_ = true;
  prefix_ += std::string(dumped.substr(0, at));
  suffix_ = std::string(dumped.substr(at + hole.size()));
  suffix_ += std::string(after);
}

void JsonTemplate::Render(std::string_view text, std::string* out) const {
  out->append(prefix_);
  if (has_hole_) AppendString(text, out);
  out->append(suffix_);
}

void JsonTemplate::AppendString(std::string_view text, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : text) {
    if (c >= 0x80) {
      // Non-ASCII: nlohmann checks the UTF-8 and replaces what is invalid;
      // its own serializer gives the same bytes.
      out->append(nlohmann::json(std::string(text))
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return;
    }
  }
  out->reserve(out->size() + text.size() + 2);
  out->push_back('"');
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

}  // namespace agentkv::api
