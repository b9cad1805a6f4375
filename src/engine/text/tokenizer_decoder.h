// The "decoder" of a tokenizer.json: turns token strings back into text.
// Implements ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace and
// Sequence with transformers.js's semantics (bytes that are not valid UTF-8
// become U+FFFD the way the WHATWG TextDecoder replaces them).
//
// Thread-safety: immutable after Build; Decode may run concurrently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/text/tokenizer_regex.h"
#include "util/status.h"

namespace agentkv::text {

class TokenizerDecoder {
 public:
  using StringSet = std::unordered_set<std::string>;
  // `config` may be null (tokens are joined with spaces). `added_tokens`
  // (contents of all added tokens) must outlive the decoder: ByteLevel
  // copies them verbatim instead of byte-decoding them.
  static Result<std::unique_ptr<TokenizerDecoder>> Build(const nlohmann::json& config,
                                                         const StringSet* added_tokens);

  // `is_sequence_start`: the first token is the first of the sequence
  // (Metaspace strips its leading space only then).
  std::string Decode(std::vector<std::string> tokens, bool is_sequence_start) const;

  // The exact bytes one token stands for wherever it appears in a sequence:
  // Decode's per-token steps without turning invalid UTF-8 into U+FFFD
  // (byte-level and byte-fallback bytes come out raw; added tokens are
  // copied by ByteLevel as Decode copies them). nullopt when the text of a
  // token depends on its position (Metaspace, Strip), when ByteLevel meets
  // a character that stands for no byte, and without a decoder.
  std::optional<std::string> TokenBytes(const std::string& token) const;

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  struct Step {
    Kind kind;
    std::unique_ptr<TokenizerRegex> pattern;  // kReplace
    std::string content;                      // kReplace; kStrip's char
    std::string replacement;                  // kMetaspace
    bool strip_first_space = false;           // kMetaspace
    int start = 0, stop = 0;                  // kStrip
  };
  Status AddSteps(const nlohmann::json& config);
  std::vector<Step> steps_;
  bool join_with_spaces_ = false;
  const StringSet* added_ = nullptr;
};

}  // namespace agentkv::text
