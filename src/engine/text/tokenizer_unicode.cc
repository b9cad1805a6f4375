#include "engine/text/tokenizer_unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace agentkv::text::tokenizer_unicode {

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  size_t left = s.size() - *pos;
  unsigned char b = p[0];
  if (b < 0x80 || left < 2) {
    *pos += 1;
    return b;
  }
  if (b < 0xE0) {
    *pos += 2;
    return (char32_t(b & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b < 0xF0 || left < 4) {
    if (left < 3) {
      *pos += left;
      return 0xFFFD;
    }
    *pos += 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *pos += 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {

// The WHATWG "UTF-8 decoder" state machine; calls emit(cp) per code point.
template <typename Emit>
void WhatwgDecode(std::string_view bytes, Emit emit) {
  int needed = 0, seen = 0;
  unsigned lower = 0x80, upper = 0xBF;
  char32_t cp = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    unsigned b = static_cast<unsigned char>(bytes[i]);
    if (needed == 0) {
      ++i;
      if (b < 0x80) {
        emit(char32_t(b));
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed = 1;
        cp = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        needed = 2;
        cp = b & 0x0F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        needed = 3;
        cp = b & 0x07;
      } else {
        emit(char32_t(0xFFFD));
      }
      continue;
    }
    if (b < lower || b > upper) {
      // The byte is not consumed: it starts the next sequence.
      needed = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      emit(char32_t(0xFFFD));
      continue;
    }
    ++i;
    lower = 0x80;
    upper = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    if (++seen == needed) {
      emit(cp);
      needed = seen = 0;
    }
  }
  if (needed != 0) emit(char32_t(0xFFFD));
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  // Well-formed UTF-8 per Unicode table 3-7 (the sequences the WHATWG
  // decoder accepts unchanged), scanned without allocating.
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    unsigned b = p[i];
    unsigned lo = 0x80, hi = 0xBF;
    int need;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + need >= n) return false;  // truncated sequence
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (int k = 2; k <= need; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    i += need + 1;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view bytes, bool* changed) {
  // Fast path: pure ASCII needs no work.
  size_t i = 0;
  while (i < bytes.size() && static_cast<unsigned char>(bytes[i]) < 0x80) ++i;
  if (i == bytes.size()) {
    if (changed) *changed = false;
    return std::string(bytes);
  }
  std::string out(bytes.substr(0, i));
  out.reserve(bytes.size() + 8);
  WhatwgDecode(bytes.substr(i), [&](char32_t cp) { AppendUtf8(cp, &out); });
  if (changed) *changed = out != bytes;
  return out;
}

bool IsJsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view JsTrimStart(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsJsWhitespace(NextCodePoint(s, &next))) break;
    pos = next;
  }
  return s.substr(pos);
}

std::string_view JsTrimEnd(std::string_view s) {
  // Scan forward, remembering where the trailing whitespace run starts.
  size_t pos = 0, run_start = 0;
  bool in_run = false;
  while (pos < s.size()) {
    size_t start = pos;
    bool ws = IsJsWhitespace(NextCodePoint(s, &pos));
    if (ws && !in_run) run_start = start;
    in_run = ws;
  }
  return in_run ? s.substr(0, run_start) : s;
}

Result<std::string> Normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  // ASCII is invariant under every normal form.
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    return InvalidArgument(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> holder(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string Lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    char32_t cp = NextCodePoint(s, &pos);
    AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), &out);
  }
  return out;
}

std::string StripMarks(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t start = pos;
    char32_t cp = NextCodePoint(s, &pos);
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME)
      continue;
    out.append(s.substr(start, pos - start));
  }
  return out;
}

const std::array<char32_t, 256>& ByteToUnicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? char32_t(b) : char32_t(256 + n++);
    }
    return t;
  }();
  return table;
}

int UnicodeToByte(char32_t cp) {
  static const auto inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    const auto& fwd = ByteToUnicode();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace agentkv::text::tokenizer_unicode
