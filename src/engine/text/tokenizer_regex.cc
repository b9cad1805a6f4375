#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/text/tokenizer_regex.h"

#include <pcre2.h>

#include <cstdio>
#include <utility>

#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {
namespace {

// JavaScript's \s (WhiteSpace + LineTerminator), written without \v because
// PCRE2 gives \v inside a class a different meaning.
constexpr std::string_view kJsSpaceSet =
    "\\x{09}-\\x{0d}\\x{20}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}\\x{feff}";

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  for (size_t pos = 0; (pos = s->find(from, pos)) != std::string::npos; pos += to.size())
    s->replace(pos, from.size(), to);
}

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Per-thread PCRE2 match state, shared by all patterns: one ovector pair is
// enough because only whole matches are used.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Result<std::string> TokenizerRegex::TranslateJsPattern(std::string_view js_pattern) {
  // transformers.js's own rewrites first (createPattern), so that we run the
  // exact RegExp it runs.
  std::string p;
  for (size_t i = 0; i < js_pattern.size(); ++i) {
    if (js_pattern[i] == '\\' && i + 1 < js_pattern.size() &&
        (js_pattern[i + 1] == '#' || js_pattern[i + 1] == '&' || js_pattern[i + 1] == '~')) {
      continue;  // drop the backslash, keep the character
    }
    p.push_back(js_pattern[i]);
  }
  ReplaceAll(&p, "(?i:'s|'t|'re|'ve|'m|'ll|'d)",
             "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))");

  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  auto unsupported = [&](std::string_view what) {
    return Unimplemented("regex pattern uses " + std::string(what) +
                         " inside a character class, which this tokenizer does not "
                         "support: " +
                         std::string(js_pattern));
  };
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[++i];
      switch (e) {
        case 's':
          out += in_class ? std::string(kJsSpaceSet) : "[" + std::string(kJsSpaceSet) + "]";
          break;
        case 'S':
          if (in_class) return unsupported("\\S");
          out += "[^" + std::string(kJsSpaceSet) + "]";
          break;
        case 'd':
          out += in_class ? "0-9" : "[0-9]";
          break;
        case 'D':
          if (in_class) return unsupported("\\D");
          out += "[^0-9]";
          break;
        case 'w':
          out += in_class ? "A-Za-z0-9_" : "[A-Za-z0-9_]";
          break;
        case 'W':
          if (in_class) return unsupported("\\W");
          out += "[^A-Za-z0-9_]";
          break;
        case 'v':
          out += "\\x{0b}";
          break;
        case 'u': {
          // \uXXXX (possibly a surrogate pair) or \u{X...}.
          auto hex4 = [&](size_t at, uint32_t* v) {
            if (at + 4 > p.size()) return false;
            *v = 0;
            for (size_t k = at; k < at + 4; ++k) {
              if (!IsHex(p[k])) return false;
              *v = *v * 16 + std::stoul(std::string(1, p[k]), nullptr, 16);
            }
            return true;
          };
          uint32_t v = 0;
          if (i + 1 < p.size() && p[i + 1] == '{') {
            size_t close = p.find('}', i + 2);
            if (close == std::string::npos)
              return InvalidArgument("bad \\u{...} escape in regex: " + std::string(js_pattern));
            out += "\\x{" + p.substr(i + 2, close - i - 2) + "}";
            i = close;
          } else if (hex4(i + 1, &v)) {
            i += 4;
            uint32_t lo = 0;
            if (v >= 0xD800 && v < 0xDC00 && i + 2 < p.size() && p[i + 1] == '\\' &&
                p[i + 2] == 'u' && hex4(i + 3, &lo) && lo >= 0xDC00 && lo < 0xE000) {
              v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
              i += 6;
            }
            char buf[16];
            std::snprintf(buf, sizeof buf, "\\x{%x}", v);
            out += buf;
          } else {
            out += "u";  // JavaScript without a valid escape: a literal u
          }
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      if (c == '[') {
        out += "\\[";  // literal in JavaScript; PCRE2 could read "[:" as POSIX
        continue;
      }
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      // JavaScript's empty classes: [] never matches, [^] matches anything.
      if (p.compare(i, 2, "[]") == 0) {
        out += "(?!)";
        ++i;
        continue;
      }
      if (p.compare(i, 3, "[^]") == 0) {
        out += "(?s:.)";
        i += 2;
        continue;
      }
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      continue;
    }
    if (c == '.') {
      out += "[^\\x{0a}\\x{0d}\\x{2028}\\x{2029}]";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

Result<std::unique_ptr<TokenizerRegex>> TokenizerRegex::Compile(const std::string& pattern,
                                                                uint32_t options) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    options | PCRE2_UTF | ((options & PCRE2_LITERAL) ? 0 : PCRE2_DOLLAR_ENDONLY),
                    &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return InvalidArgument("cannot compile regex /" + pattern + "/ at offset " +
                           std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
  }
  std::unique_ptr<TokenizerRegex> re(new TokenizerRegex());
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Result<std::unique_ptr<TokenizerRegex>> TokenizerRegex::FromPattern(std::string_view js_pattern) {
  ASSIGN_OR_RETURN(std::string translated, TranslateJsPattern(js_pattern));
  return Compile(translated, 0);
}

Result<std::unique_ptr<TokenizerRegex>> TokenizerRegex::FromLiteral(std::string_view literal) {
  if (literal.empty()) return InvalidArgument("empty String pattern");
  return Compile(std::string(literal), PCRE2_LITERAL);
}

TokenizerRegex::~TokenizerRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Status TokenizerRegex::ForEachMatch(std::string_view text,
                                    const std::function<void(size_t, size_t)>& on_match) const {
  MatchState& st = ThreadMatchState();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  auto* code = static_cast<pcre2_code*>(code_);
  bool use_jit = jit_;
  while (pos <= text.size()) {
    int rc = use_jit ? pcre2_jit_match(code, subject, text.size(), pos, 0, st.data, st.context)
                     : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.data,
                                   st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && use_jit) {
      use_jit = false;  // the interpreter keeps its frames on the heap
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return ResourceExhausted(std::string("regex match failed: ") + reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t b = ov[0], e = ov[1];
    on_match(b, e);
    if (e > b) {
      pos = e;
    } else {
      if (e >= text.size()) break;
      pos = e + tokenizer_unicode::Utf8Len(static_cast<unsigned char>(text[e]));
    }
  }
  return Status::Ok();
}

}  // namespace agentkv::text
