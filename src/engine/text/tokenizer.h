// Tokenizer: a Hugging Face tokenizer.json (BPE models: byte-level BPE as in
// Llama 3 and Qwen, SentencePiece-style BPE with byte fallback as in Gemma)
// whose token ids equal transformers.js's (the reference) on any input.
//
// Pipeline, as transformers.js runs it: added tokens are split out of the raw
// text first (longest match, leftmost first; lstrip/rstrip trim the
// neighbouring text; single_word and normalized are ignored, as the
// reference ignores them); each remaining section is normalized,
// pre-tokenized and BPE-encoded; the post-processor adds BOS/EOS when
// add_special_tokens is set.
//
// Invalid UTF-8 input never crashes: each maximal invalid subsequence is
// replaced by U+FFFD first (what a JavaScript caller decoding those bytes
// would pass in), then encoded like any other text.
//
// Thread-safety: Load builds an immutable object; Encode/Decode and every
// other const method may run concurrently from many threads (the BPE word
// cache is per thread).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace agentkv::text {

namespace tokenizer_internal {
struct Pipeline;
}

class Tokenizer {
 public:
  // Loads `tokenizer_json` and, if present, tokenizer_config.json from the
  // same folder (clean_up_tokenization_spaces, additional_special_tokens,
  // bos/eos token names). Errors name the file: NotFound, Corruption for
  // malformed JSON, Unimplemented for a model/normalizer/pre-tokenizer/
  // post-processor/decoder type this class does not implement.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::filesystem::path& tokenizer_json);
  // Same, from JSON text already in memory; `name` is used in messages.
  // `config_json` may be empty.
  static Result<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                     std::string_view config_json,
                                                     std::string_view name);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`; `add_special_tokens` runs the post-processor's
  // template (BOS for Llama 3 and Gemma 3), like HF's default.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of `ids` as transformers.js decodes them: byte-level / byte-fallback
  // bytes that do not form valid UTF-8 become U+FFFD; ids outside the
  // vocabulary are skipped; clean_up_tokenization_spaces is applied when the
  // config asks for it (the default when there is no config).
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Decode for a run of ids that continues a sequence (is_sequence_start ==
  // false skips decoders' first-token handling, e.g. Metaspace's
  // leading-space strip). Decode(ids) == DecodeFragment(ids, .., true).
  std::string DecodeFragment(std::span<const int32_t> ids, bool skip_special_tokens,
                             bool is_sequence_start) const;
  // The exact bytes token `id` stands for in text: byte-level and
  // byte-fallback bytes raw (a UTF-8 character split across tokens is split
  // across their bytes too, never U+FFFD), added tokens, special ones
  // included, verbatim, no clean-up. For byte-level BPE (Llama 3, Qwen) and
  // byte-fallback BPE without a prepended space (Gemma 3), the bytes of the
  // ids Encode(text, false) returns concatenate to `text` whenever the
  // normalizer leaves it unchanged. nullopt for ids outside the vocabulary
  // or in a hole of it, and for decoders whose per-token text depends on the
  // token's position (see TokenizerDecoder::TokenBytes).
  std::optional<std::string> TokenBytes(int32_t id) const;
  // Whether Decode rewrites " ." to "." and the like across token borders.
  bool cleans_up_tokenization_spaces() const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string as stored in tokenizer.json ("" for unknown ids).
  std::string IdToToken(int32_t id) const;
  // One past the largest id (vocabulary plus added tokens).
  int32_t vocab_size() const;
  // Added tokens marked special, plus the config's additional_special_tokens.
  bool IsSpecial(int32_t id) const;
  // tokenizer.json's added tokens, special or not (<|im_start|>, <think>):
  // Encode always turns their text into their id.
  bool IsAdded(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer_internal::Pipeline> p);
  std::unique_ptr<tokenizer_internal::Pipeline> p_;
};

}  // namespace agentkv::text
