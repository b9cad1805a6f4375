// Helpers for holding back streamed text that might be the start of a
// marker (a stop string, a tag) until the next piece decides.
#pragma once

#include <cstddef>
#include <string_view>

namespace agentkv::text::output {

// Length of the longest suffix of `text` that is a proper, non-empty prefix
// of `pattern`: the bytes that must be held back because `pattern` might
// complete in the next piece. 0 when none.
inline size_t PartialSuffixLength(std::string_view text, std::string_view pattern) {
  if (pattern.empty()) return 0;
  size_t k = text.size() < pattern.size() - 1 ? text.size() : pattern.size() - 1;
  for (; k > 0; --k) {
    if (text.substr(text.size() - k) == pattern.substr(0, k)) return k;
  }
  return 0;
}

inline bool IsJsonSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace agentkv::text::output
