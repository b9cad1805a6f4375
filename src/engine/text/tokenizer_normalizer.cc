#include "engine/text/tokenizer_normalizer.h"

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {

namespace tu = tokenizer_unicode;

Status TokenizerNormalizer::AddSteps(const nlohmann::json& config) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object()) return Corruption("normalizer is not an object");
  std::string type = config.value("type", std::string());
  Step step;
  if (type == "Sequence") {
    for (const auto& sub : config.at("normalizers")) RETURN_IF_ERROR(AddSteps(sub));
    return Status::Ok();
  } else if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = Kind::kNfkd;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const auto& pat = config.at("pattern");
    Result<std::unique_ptr<TokenizerRegex>> re =
        pat.contains("Regex")    ? TokenizerRegex::FromPattern(pat["Regex"].get<std::string>())
        : pat.contains("String") ? TokenizerRegex::FromLiteral(pat["String"].get<std::string>())
                                 : Result<std::unique_ptr<TokenizerRegex>>(Corruption(
                                       "Replace normalizer pattern is neither Regex nor String"));
    if (!re.ok()) return re.status().WithContext("Replace normalizer");
    step.pattern = std::move(re).value();
    step.content = config.at("content").get<std::string>();
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    step.content = config.at("prepend").get<std::string>();
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.left = config.value("strip_left", false);
    step.right = config.value("strip_right", false);
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "StripAccents") {
    step.kind = Kind::kStripAccents;
  } else {
    return Unimplemented("normalizer type \"" + type + "\" is not supported");
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

Result<std::unique_ptr<TokenizerNormalizer>> TokenizerNormalizer::Build(
    const nlohmann::json& config) {
  std::unique_ptr<TokenizerNormalizer> n(new TokenizerNormalizer());
  RETURN_IF_ERROR(n->AddSteps(config));
  return n;
}

std::string TokenizerNormalizer::Apply(std::string_view text) const {
  std::string cur(text);
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kNfc:
      case Kind::kNfd:
      case Kind::kNfkc:
      case Kind::kNfkd: {
        static constexpr tu::NormalForm kForms[] = {tu::NormalForm::kNfc, tu::NormalForm::kNfd,
                                                    tu::NormalForm::kNfkc, tu::NormalForm::kNfkd};
        // Valid UTF-8 cannot fail to normalize; keep the text if it did.
        auto r = tu::Normalize(cur, kForms[static_cast<int>(s.kind)]);
        if (r.ok()) cur = std::move(r).value();
        break;
      }
      case Kind::kReplace: {
        std::string out;
        out.reserve(cur.size());
        size_t last = 0;
        Status st = s.pattern->ForEachMatch(cur, [&](size_t b, size_t e) {
          out.append(cur, last, b - last);
          out += s.content;
          last = e;
        });
        if (!st.ok()) break;  // resource error: leave this step's input as is
        out.append(cur, last, std::string::npos);
        cur = std::move(out);
        break;
      }
      case Kind::kPrepend:
        cur = s.content + cur;
        break;
      case Kind::kStrip: {
        std::string_view v = cur;
        if (s.left) v = tu::JsTrimStart(v);
        if (s.right) v = tu::JsTrimEnd(v);
        cur = std::string(v);
        break;
      }
      case Kind::kLowercase:
        cur = tu::Lowercase(cur);
        break;
      case Kind::kStripAccents:
        cur = tu::StripMarks(cur);
        break;
    }
  }
  return cur;
}

}  // namespace agentkv::text
