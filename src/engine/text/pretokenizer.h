// The "pre_tokenizer" of a tokenizer.json: cuts a normalized section into
// the words BPE runs on. Implements Sequence, Split, ByteLevel, Metaspace,
// Digits, Whitespace, WhitespaceSplit and Punctuation with transformers.js's
// semantics (Split isolates its matches whatever the declared behavior,
// except "Removed"; invert keeps only the matches).
//
// ByteLevel must come last: instead of rewriting bytes into GPT-2's
// printable alphabet it marks the output as byte-level, and the BPE model
// maps bytes itself (faster, same ids).
//
// Thread-safety: immutable after Build; Run may be called concurrently.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/text/tokenizer_regex.h"
#include "util/status.h"

namespace agentkv::text {

class PreTokenizer {
 public:
  // `config` may be null (the whole section is one word).
  static Result<std::unique_ptr<PreTokenizer>> Build(const nlohmann::json& config);

  // Appends the words of `text` to `out`. Words point into `text` or into
  // strings appended to `arena` (which must outlive them). `section_index`
  // is the section's position among the added-token split (Metaspace's
  // prepend_scheme "first" uses it).
  Status Run(std::string_view text, int section_index, std::deque<std::string>* arena,
             std::vector<std::string_view>* out) const;

  // True when words are raw bytes for byte-level BPE.
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { kSplit, kRemove, kMatch, kPrefixSpace, kMetaspace };
  struct Step {
    Kind kind;
    std::unique_ptr<TokenizerRegex> regex;
    std::string replacement;  // kMetaspace
    bool prepend = false;     // kMetaspace
    bool first_only = false;  // kMetaspace prepend_scheme "first"
  };
  Status AddSteps(const nlohmann::json& config, bool is_last);
  Status AddMatch(Kind kind, std::string_view js_pattern);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace agentkv::text
