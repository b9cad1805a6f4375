// UTF-8 helpers shared by the tokenizer pieces. The tokenizer mirrors
// transformers.js, whose strings are JavaScript strings, so the helpers here
// reproduce JavaScript's notions (String.prototype.trim's whitespace set, the
// WHATWG TextDecoder's replacement of invalid bytes) on UTF-8 bytes.
// All functions are pure and thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv::text::tokenizer_unicode {

// Decodes one code point at `s[*pos]` and advances `*pos`. Requires valid
// UTF-8 (as produced by SanitizeUtf8).
char32_t NextCodePoint(std::string_view s, size_t* pos);

void AppendUtf8(char32_t cp, std::string* out);

// Length in bytes of the UTF-8 sequence starting with lead byte `b` (1 for
// continuation or invalid bytes, so loops always advance).
inline size_t Utf8Len(unsigned char b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

// Converts arbitrary bytes to valid UTF-8 the way the WHATWG TextDecoder does
// (every maximal invalid subpart becomes U+FFFD). Valid input is returned
// unchanged. `*changed` (optional) says whether anything was replaced.
std::string SanitizeUtf8(std::string_view bytes, bool* changed = nullptr);

// True when `bytes` is well-formed UTF-8 (no surrogates, no overlongs).
bool IsValidUtf8(std::string_view bytes);

// JavaScript's WhiteSpace + LineTerminator set (what \s and trim() use).
bool IsJsWhitespace(char32_t cp);

// JavaScript String.prototype.trimStart / trimEnd.
std::string_view JsTrimStart(std::string_view s);
std::string_view JsTrimEnd(std::string_view s);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Unicode normalization through utf8proc. Input must be valid UTF-8.
Result<std::string> Normalize(std::string_view s, NormalForm form);

// Full lowercase mapping of each code point (utf8proc's simple mapping).
std::string Lowercase(std::string_view s);
// Removes combining marks (general category M*), like \p{M} removal.
std::string StripMarks(std::string_view s);

// GPT-2's byte <-> printable code point table used by ByteLevel.
const std::array<char32_t, 256>& ByteToUnicode();
// Inverse of ByteToUnicode; -1 for code points that are not in the table.
int UnicodeToByte(char32_t cp);

}  // namespace agentkv::text::tokenizer_unicode
