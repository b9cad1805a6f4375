// JsonTemplate: a JSON document with one string left open, serialized once,
// so a stream's per-token events (an OpenAI chunk, an Anthropic text delta)
// cost one string escape instead of building and dumping a JSON object per
// token. Render's output is byte for byte what dumping the document with
// the text in the hole gives (nlohmann, compact, invalid UTF-8 replaced).
//
// Thread-safety: immutable after construction; Render is const.
#pragma once

#include <string>
#include <string_view>

namespace agentkv::api {

class JsonTemplate {
 public:
  // The placeholder to put where the text goes, as a JSON string value.
  static constexpr const char* kHole = "@@agentkv.json.hole@@";

  JsonTemplate() = default;
  // `before` + the compact dump of a document holding kHole once + `after`
  // (e.g. "data: " and "\n\n"). The first occurrence of the quoted hole is
  // the one filled.
  JsonTemplate(std::string_view before, std::string_view dumped, std::string_view after);

  // Appends the document with `text` in the hole.
  void Render(std::string_view text, std::string* out) const;

  bool empty() const { return prefix_.empty(); }

  // Appends `text` as a JSON string literal (quotes included), as
  // nlohmann's compact dump with error_handler_t::replace writes it.
  static void AppendString(std::string_view text, std::string* out);

 private:
  std::string prefix_, suffix_;
  bool has_hole_ = false;
};

}  // namespace agentkv::api
