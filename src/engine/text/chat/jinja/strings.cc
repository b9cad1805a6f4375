#include "engine/text/chat/jinja/strings.h"

#include <utf8proc.h>

namespace agentkv::text::chat::jinja {
namespace {

// Decodes one code point at s[i]; invalid bytes decode as themselves.
uint32_t Decode(std::string_view s, size_t& i) {
  int32_t cp = 0;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                            static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0) {
    return static_cast<unsigned char>(s[i++]);
  }
  i += n;
  return static_cast<uint32_t>(cp);
}

void Encode(uint32_t cp, std::string& out) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<char*>(buf), n);
}

bool IsAscii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::vector<uint32_t> Decode(std::string_view s) {
  std::vector<uint32_t> out;
  size_t i = 0;
  while (i < s.size()) out.push_back(Decode(s, i));
  return out;
}

bool IsAlpha(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

uint32_t Upper(uint32_t cp) {
  return static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t Lower(uint32_t cp) {
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}
uint32_t Title(uint32_t cp) {
  return static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
}

}  // namespace

std::vector<std::string> SplitCodepoints(std::string_view s) {
  std::vector<std::string> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    Decode(s, i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

size_t CodepointCount(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

bool IsPyWhitespace(uint32_t cp) {
  switch (cp) {
    case ' ':
    case '\t':
    case '\n':
    case '\r':
    case 0x0b:
    case 0x0c:
    case 0x1c:
    case 0x1d:
    case 0x1e:
    case 0x1f:
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  std::vector<uint32_t> set;
  if (chars) set = Decode(*chars);
  auto strip_it = [&](uint32_t cp) {
    if (!chars) return IsPyWhitespace(cp);
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  };
  // Work on code point boundaries.
  std::vector<size_t> offs;
  std::vector<uint32_t> cps;
  size_t i = 0;
  while (i < s.size()) {
    offs.push_back(i);
    cps.push_back(Decode(s, i));
  }
  offs.push_back(s.size());
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return std::string(s.substr(offs[b], offs[e] - offs[b]));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < s.size()) {
      size_t j = i;
      if (!IsPyWhitespace(Decode(s, j))) break;
      i = j;
    }
  };
  skip_ws();
  while (i < s.size()) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      // The rest, with trailing whitespace stripped.
      out.push_back(PyStrip(s.substr(i), std::nullopt, false, true));
      return out;
    }
    size_t start = i;
    while (i < s.size()) {
      size_t j = i;
      if (IsPyWhitespace(Decode(s, j))) break;
      i = j;
    }
    out.emplace_back(s.substr(start, i - start));
    skip_ws();
  }
  return out;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c;
    return out;
  }
  for (uint32_t cp : Decode(s)) Encode(Upper(cp), out);
  return out;
}

std::string PyLower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
    return out;
  }
  for (uint32_t cp : Decode(s)) Encode(Lower(cp), out);
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (uint32_t cp : Decode(s)) {
    Encode(first ? Title(cp) : Lower(cp), out);
    first = false;
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  // Split into runs of separators ([-\s({[<]) and words; capitalise words.
  std::string out;
  bool word_start = true;
  for (uint32_t cp : Decode(s)) {
    bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || IsPyWhitespace(cp);
    if (sep) {
      Encode(cp, out);
      word_start = true;
    } else {
      Encode(word_start ? Upper(cp) : Lower(cp), out);
      word_start = false;
    }
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t cp : Decode(s)) {
    bool alpha = IsAlpha(cp);
    Encode(alpha ? (prev_cased ? Lower(cp) : Title(cp)) : cp, out);
    prev_cased = alpha;
  }
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` between every code point and at both ends.
    auto cps = SplitCodepoints(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) out += cps[i];
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(repl);
    pos = f + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace agentkv::text::chat::jinja
