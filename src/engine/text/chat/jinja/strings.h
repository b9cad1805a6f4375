// Python str semantics over UTF-8 std::string: code point indexing and
// slicing, strip/split with Python's whitespace rules, case mapping.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agentkv::text::chat::jinja {

std::vector<std::string> SplitCodepoints(std::string_view s);
size_t CodepointCount(std::string_view s);
bool IsPyWhitespace(uint32_t cp);

// str.strip / lstrip / rstrip; `chars` absent means whitespace.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// str.split(sep=None, maxsplit=-1).
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit);
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyCapitalize(std::string_view s);
// jinja2's title filter (words start after whitespace, '-', and brackets).
std::string JinjaTitle(std::string_view s);
// str.title (Python's: words are runs of letters).
std::string PyTitle(std::string_view s);
std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count);

// Python slice of a sequence.
template <typename T>
std::vector<T> PySlice(const std::vector<T>& v, std::optional<int64_t> start,
                       std::optional<int64_t> stop, std::optional<int64_t> step) {
  const int64_t n = static_cast<int64_t>(v.size());
  int64_t st = step.value_or(1);
  if (st == 0) st = 1;
  std::vector<T> out;
  if (st > 0) {
    int64_t b = start.value_or(0), e = stop.value_or(n);
    if (b < 0) b = std::max<int64_t>(b + n, 0);
    if (e < 0) e = std::max<int64_t>(e + n, 0);
    b = std::min(b, n);
    e = std::min(e, n);
    for (int64_t i = b; i < e; i += st) out.push_back(v[i]);
  } else {
    int64_t b = start ? *start : n - 1, e = stop ? *stop : -1;
    if (start) {
      if (b < 0) b += n;
      if (b < 0) b = -1;
      if (b >= n) b = n - 1;
    }
    if (stop) {
      if (e < 0) e += n;
      if (e < 0) e = -1;
      if (e >= n) e = n - 1;
    }
    for (int64_t i = b; i > e; i += st) out.push_back(v[i]);
  }
  return out;
}

}  // namespace agentkv::text::chat::jinja
