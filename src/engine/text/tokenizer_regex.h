// A compiled tokenizer pattern. tokenizer.json patterns are written for
// Python/Rust regex engines and transformers.js runs them as JavaScript
// RegExps with the "u" flag; this class applies transformers.js's rewrites and
// then translates JavaScript semantics to PCRE2 (UTF mode, JIT when
// available) so matches are identical: \s is JavaScript's whitespace set,
// \d and \w are ASCII, "." excludes line terminators, "$" only matches at the
// end.
//
// Thread-safety: immutable after construction; ForEachMatch may be called
// from any number of threads at once (match state is per thread).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv::text {

class TokenizerRegex {
 public:
  // `js_pattern`: a tokenizer.json {"Regex": ...} pattern.
  static Result<std::unique_ptr<TokenizerRegex>> FromPattern(std::string_view js_pattern);
  // `literal`: a tokenizer.json {"String": ...} pattern, matched verbatim.
  static Result<std::unique_ptr<TokenizerRegex>> FromLiteral(std::string_view literal);

  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  // Calls on_match(begin, end) for each match, left to right, with
  // JavaScript matchAll semantics (after an empty match the search moves on
  // by one code point). `text` must be valid UTF-8. Fails only if PCRE2
  // reports a resource error.
  Status ForEachMatch(std::string_view text,
                      const std::function<void(size_t, size_t)>& on_match) const;

  // The JavaScript-to-PCRE2 translation, exposed for tests.
  static Result<std::string> TranslateJsPattern(std::string_view js_pattern);

 private:
  TokenizerRegex() = default;
  static Result<std::unique_ptr<TokenizerRegex>> Compile(const std::string& pattern,
                                                         uint32_t options);

  void* code_ = nullptr;  // pcre2_code*, kept opaque so pcre2.h stays private
  bool jit_ = false;
};

}  // namespace agentkv::text
