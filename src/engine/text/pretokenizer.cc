#include "engine/text/pretokenizer.h"

#include <nlohmann/json.hpp>

namespace agentkv::text {

namespace {
// transformers.js's ByteLevel pattern when use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kPunctuation =
    R"(\p{P}\u0021-\u002F\u003A-\u0040\u005B-\u0060\u007B-\u007E)";
}  // namespace

Status PreTokenizer::AddMatch(Kind kind, std::string_view js_pattern) {
  ASSIGN_OR_RETURN(auto re, TokenizerRegex::FromPattern(js_pattern));
  Step step{kind, std::move(re), {}, false, false};
  steps_.push_back(std::move(step));
  return Status::Ok();
}

Status PreTokenizer::AddSteps(const nlohmann::json& config, bool is_last) {
  if (config.is_null()) return Status::Ok();
  if (!config.is_object()) return Corruption("pre_tokenizer is not an object");
  if (byte_level_) {
    return Unimplemented("a pre-tokenizer after ByteLevel is not supported");
  }
  std::string type = config.value("type", std::string());
  if (type == "Sequence") {
    const auto& subs = config.at("pretokenizers");
    for (size_t i = 0; i < subs.size(); ++i)
      RETURN_IF_ERROR(AddSteps(subs[i], is_last && i + 1 == subs.size()));
    return Status::Ok();
  }
  if (type == "Split") {
    const auto& pat = config.at("pattern");
    Result<std::unique_ptr<TokenizerRegex>> re =
        pat.contains("Regex")    ? TokenizerRegex::FromPattern(pat["Regex"].get<std::string>())
        : pat.contains("String") ? TokenizerRegex::FromLiteral(pat["String"].get<std::string>())
                                 : Result<std::unique_ptr<TokenizerRegex>>(
                                       Corruption("Split pattern is neither Regex nor String"));
    if (!re.ok()) return re.status().WithContext("Split pre-tokenizer");
    std::string behavior = config.value("behavior", std::string("Isolated"));
    for (auto& c : behavior) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    Kind kind = config.value("invert", false) ? Kind::kMatch
                : behavior == "removed"       ? Kind::kRemove
                                              : Kind::kSplit;
    steps_.push_back(Step{kind, std::move(re).value(), {}, false, false});
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    if (!is_last) return Unimplemented("ByteLevel pre-tokenizer must be the last one");
    if (config.value("add_prefix_space", false))
      steps_.push_back(Step{Kind::kPrefixSpace, nullptr, {}, false, false});
    if (config.value("use_regex", true)) RETURN_IF_ERROR(AddMatch(Kind::kMatch, kGpt2Pattern));
    byte_level_ = true;
    return Status::Ok();
  }
  if (type == "Metaspace") {
    Step step{Kind::kMetaspace, nullptr, config.value("replacement", std::string("\xE2\x96\x81")),
              false, false};
    std::string scheme = config.value("prepend_scheme", std::string("always"));
    // Older files say add_prefix_space; newer ones only prepend_scheme.
    bool add = config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean()
                   ? config["add_prefix_space"].get<bool>()
                   : scheme != "never";
    step.prepend = add && scheme != "never";
    step.first_only = scheme == "first";
    steps_.push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Digits") {
    return AddMatch(Kind::kMatch,
                    config.value("individual_digits", false) ? R"([^\d]+|\d)" : R"([^\d]+|\d+)");
  }
  if (type == "WhitespaceSplit") return AddMatch(Kind::kMatch, R"(\S+)");
  if (type == "Whitespace") return AddMatch(Kind::kMatch, R"(\w+|[^\w\s]+)");
  if (type == "Punctuation") {
    std::string p = "[^" + std::string(kPunctuation) + "]+|[" + std::string(kPunctuation) + "]+";
    return AddMatch(Kind::kMatch, p);
  }
  return Unimplemented("pre-tokenizer type \"" + type + "\" is not supported");
}

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::Build(const nlohmann::json& config) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  RETURN_IF_ERROR(p->AddSteps(config, true));
  return p;
}

Status PreTokenizer::Run(std::string_view text, int section_index, std::deque<std::string>* arena,
                         std::vector<std::string_view>* out) const {
  if (steps_.empty()) {
    out->push_back(text);
    return Status::Ok();
  }
  thread_local std::vector<std::string_view> cur, next;
  cur.clear();
  cur.push_back(text);
  for (size_t si = 0; si < steps_.size(); ++si) {
    const Step& step = steps_[si];
    auto& dst = si + 1 == steps_.size() ? *out : next;
    if (&dst == &next) next.clear();
    for (std::string_view piece : cur) {
      switch (step.kind) {
        case Kind::kSplit: {
          size_t prev = 0;
          RETURN_IF_ERROR(step.regex->ForEachMatch(piece, [&](size_t b, size_t e) {
            if (b > prev) dst.push_back(piece.substr(prev, b - prev));
            if (e > b) dst.push_back(piece.substr(b, e - b));
            prev = e;
          }));
          if (prev < piece.size()) dst.push_back(piece.substr(prev));
          break;
        }
        case Kind::kRemove: {
          size_t prev = 0;
          RETURN_IF_ERROR(step.regex->ForEachMatch(piece, [&](size_t b, size_t e) {
            if (b > prev) dst.push_back(piece.substr(prev, b - prev));
            prev = e;
          }));
          if (prev < piece.size()) dst.push_back(piece.substr(prev));
          break;
        }
        case Kind::kMatch:
          RETURN_IF_ERROR(step.regex->ForEachMatch(piece, [&](size_t b, size_t e) {
            if (e > b) dst.push_back(piece.substr(b, e - b));
          }));
          break;
        case Kind::kPrefixSpace:
          if (!piece.starts_with(' ')) {
            arena->push_back(" " + std::string(piece));
            dst.push_back(arena->back());
          } else {
            dst.push_back(piece);
          }
          break;
        case Kind::kMetaspace: {
          std::string s;
          s.reserve(piece.size() + 8);
          for (char c : piece) {
            if (c == ' ')
              s += step.replacement;
            else
              s.push_back(c);
          }
          if (step.prepend && !std::string_view(s).starts_with(step.replacement) &&
              (!step.first_only || section_index == 0))
            s = step.replacement + s;
          arena->push_back(std::move(s));
          dst.push_back(arena->back());
          break;
        }
      }
    }
    if (&dst == &next) std::swap(cur, next);
  }
  return Status::Ok();
}

}  // namespace agentkv::text
