// The "normalizer" of a tokenizer.json, applied to each text section between
// added tokens: NFC/NFD/NFKC/NFKD, Replace, Prepend, Strip, Lowercase,
// StripAccents and Sequence, with transformers.js's semantics.
//
// Thread-safety: immutable after Build; Apply may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/text/tokenizer_regex.h"
#include "util/status.h"

namespace agentkv::text {

class TokenizerNormalizer {
 public:
  // `config` is tokenizer.json's "normalizer" (may be null: no-op).
  // Unimplemented for types this class does not know (BertNormalizer,
  // Precompiled, ...).
  static Result<std::unique_ptr<TokenizerNormalizer>> Build(const nlohmann::json& config);

  bool is_noop() const { return steps_.empty(); }
  // `text` must be valid UTF-8; the result is valid UTF-8.
  std::string Apply(std::string_view text) const;

 private:
  enum class Kind {
    kNfc,
    kNfd,
    kNfkc,
    kNfkd,
    kReplace,
    kPrepend,
    kStrip,
    kLowercase,
    kStripAccents
  };
  struct Step {
    Kind kind;
    std::unique_ptr<TokenizerRegex> pattern;  // kReplace
    std::string content;                      // kReplace, kPrepend
    bool left = false, right = false;         // kStrip
  };
  Status AddSteps(const nlohmann::json& config);
  std::vector<Step> steps_;
};

}  // namespace agentkv::text
