#include "engine/text/tokenizer_decoder.h"

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {

namespace tu = tokenizer_unicode;

namespace {

// "<0xNN>" -> NN, read the way transformers.js does (parseInt of the two
// characters after "<0x", which accepts a leading hex prefix).
int ByteFallbackValue(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  int v = -1;
  for (size_t i = 3; i < 5; ++i) {
    char c = t[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) break;
    v = (v < 0 ? 0 : v * 16) + d;
  }
  return v;
}

std::string ByteLevelToText(const std::vector<std::string>& toks) {
  std::string bytes;
  for (const auto& t : toks) {
    for (size_t pos = 0; pos < t.size();) {
      int b = tu::UnicodeToByte(tu::NextCodePoint(t, &pos));
      bytes.push_back(static_cast<char>(b < 0 ? 0 : b));  // JS: undefined -> 0
    }
  }
  return tu::SanitizeUtf8(bytes);
}

}  // namespace

std::optional<std::string> TokenizerDecoder::TokenBytes(const std::string& token) const {
  if (join_with_spaces_) return std::nullopt;
  std::string t = token;
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kByteLevel: {
        if (added_ && added_->count(t)) break;
        std::string bytes;
        for (size_t pos = 0; pos < t.size();) {
          const int b = tu::UnicodeToByte(tu::NextCodePoint(t, &pos));
          if (b < 0) return std::nullopt;
          bytes.push_back(static_cast<char>(b));
        }
        t = std::move(bytes);
        break;
      }
      case Kind::kByteFallback: {
        const int b = ByteFallbackValue(t);
        if (b >= 0) t = std::string(1, static_cast<char>(b));
        break;
      }
      case Kind::kFuse:
        break;  // joins neighbours; one token's bytes are unchanged
      case Kind::kStrip:
        if (s.start != 0 || s.stop != 0) return std::nullopt;
        break;
      case Kind::kReplace: {
        std::string out;
        size_t last = 0;
        Status st = s.pattern->ForEachMatch(t, [&](size_t b, size_t e) {
          out.append(t, last, b - last);
          out += s.content;
          last = e;
        });
        if (!st.ok()) return std::nullopt;
        out.append(t, last, std::string::npos);
        t = std::move(out);
        break;
      }
      case Kind::kMetaspace:
        return std::nullopt;
    }
  }
  return t;
}

Status TokenizerDecoder::AddSteps(const nlohmann::json& config) {
  std::string type = config.value("type", std::string());
  Step step;
  if (type == "Sequence") {
    for (const auto& sub : config.at("decoders")) RETURN_IF_ERROR(AddSteps(sub));
    return Status::Ok();
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.content = config.at("content").get<std::string>();
    step.start = config.value("start", 0);
    step.stop = config.value("stop", 0);
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const auto& pat = config.at("pattern");
    Result<std::unique_ptr<TokenizerRegex>> re =
        pat.contains("Regex")    ? TokenizerRegex::FromPattern(pat["Regex"].get<std::string>())
        : pat.contains("String") ? TokenizerRegex::FromLiteral(pat["String"].get<std::string>())
                                 : Result<std::unique_ptr<TokenizerRegex>>(Corruption(
                                       "Replace decoder pattern is neither Regex nor String"));
    if (!re.ok()) return re.status().WithContext("Replace decoder");
    step.pattern = std::move(re).value();
    step.content = config.at("content").get<std::string>();
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = config.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = config.value("prepend_scheme", std::string("always"));
    step.strip_first_space =
        config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean()
            ? config["add_prefix_space"].get<bool>()
            : scheme != "never";
  } else {
    return Unimplemented("decoder type \"" + type + "\" is not supported");
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

Result<std::unique_ptr<TokenizerDecoder>> TokenizerDecoder::Build(const nlohmann::json& config,
                                                                  const StringSet* added_tokens) {
  std::unique_ptr<TokenizerDecoder> d(new TokenizerDecoder());
  d->added_ = added_tokens;
  if (config.is_null()) {
    d->join_with_spaces_ = true;
    return d;
  }
  if (!config.is_object()) return Corruption("decoder is not an object");
  RETURN_IF_ERROR(d->AddSteps(config));
  return d;
}

std::string TokenizerDecoder::Decode(std::vector<std::string> tokens,
                                     bool is_sequence_start) const {
  if (join_with_spaces_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  for (const Step& s : steps_) {
    std::vector<std::string> next;
    switch (s.kind) {
      case Kind::kByteLevel: {
        std::vector<std::string> run;
        for (auto& t : tokens) {
          if (added_ && added_->count(t)) {
            if (!run.empty()) next.push_back(ByteLevelToText(run));
            run.clear();
            next.push_back(std::move(t));
          } else {
            run.push_back(std::move(t));
          }
        }
        if (!run.empty()) next.push_back(ByteLevelToText(run));
        break;
      }
      case Kind::kByteFallback: {
        std::string bytes;
        bool have = false;
        for (auto& t : tokens) {
          int b = ByteFallbackValue(t);
          if (b >= 0) {
            bytes.push_back(static_cast<char>(b));
            have = true;
            continue;
          }
          if (have) next.push_back(tu::SanitizeUtf8(bytes));
          bytes.clear();
          have = false;
          next.push_back(std::move(t));
        }
        if (have) next.push_back(tu::SanitizeUtf8(bytes));
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case Kind::kStrip: {
        for (auto& t : tokens) {
          std::string_view v = t;
          for (int i = 0; i < s.start && v.starts_with(s.content); ++i)
            v.remove_prefix(s.content.size());
          for (int i = 0; i < s.stop && v.ends_with(s.content); ++i)
            v.remove_suffix(s.content.size());
          next.emplace_back(v);
        }
        break;
      }
      case Kind::kReplace: {
        for (auto& t : tokens) {
          std::string out;
          size_t last = 0;
          Status st = s.pattern->ForEachMatch(t, [&](size_t b, size_t e) {
            out.append(t, last, b - last);
            out += s.content;
            last = e;
          });
          if (!st.ok()) {
            next.push_back(std::move(t));
            continue;
          }
          out.append(t, last, std::string::npos);
          next.push_back(std::move(out));
        }
        break;
      }
      case Kind::kMetaspace: {
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          std::string_view t = tokens[i];
          for (size_t p = 0; p < t.size();) {
            if (t.compare(p, s.replacement.size(), s.replacement) == 0 && !s.replacement.empty()) {
              out.push_back(' ');
              p += s.replacement.size();
            } else {
              out.push_back(t[p++]);
            }
          }
          if (s.strip_first_space && i == 0 && is_sequence_start && out.starts_with(' '))
            out.erase(0, 1);
          next.push_back(std::move(out));
        }
        break;
      }
    }
    tokens = std::move(next);
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace agentkv::text
