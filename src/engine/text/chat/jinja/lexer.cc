#include "engine/text/chat/jinja/lexer.h"

#include <cctype>

#include "engine/text/chat/jinja/error.h"

namespace agentkv::text::chat::jinja {
namespace {

[[noreturn]] void SyntaxError(const std::string& msg, int line) {
  throw TemplateError(TemplateError::Kind::kSyntax, msg, line);
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// jinja2 replaces \r\n and \r by \n and, unless told otherwise, drops one
// final newline.
std::string Normalize(std::string_view src, bool keep_trailing_newline) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes Python string-literal escapes; unknown escapes stay as written.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    auto hex = [&](size_t n) -> bool {
      uint32_t cp = 0;
      for (size_t k = 1; k <= n; ++k) {
        if (i + k >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + k]))) return false;
        char h = s[i + k];
        cp = cp * 16 +
             (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      AppendUtf8(cp, out);
      i += n;
      return true;
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '0':
        out += '\0';
        break;
      case '\n':
        break;
      case 'x':
        if (!hex(2)) out += "\\x";
        break;
      case 'u':
        if (!hex(4)) out += "\\u";
        break;
      case 'U':
        if (!hex(8)) out += "\\U";
        break;
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& opt) : src_(std::move(src)), opt_(opt) {}

  std::vector<Token> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = FindTagStart(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        Emit(Token::Type::kData, std::move(text), line_);
        pos_ = tag;
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsSpace(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool only_ws = true;
          for (size_t k = l_pos; k < text.size(); ++k)
            if (text[k] != ' ' && text[k] != '\t') only_ws = false;
          if (only_ws) text.resize(l_pos);
        }
      }
      int text_line = line_;
      Advance(tag);
      if (!text.empty()) Emit(Token::Type::kData, std::move(text), text_line);
      size_t body = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      Advance(body);
      if (kind == '#') {
        line_starting = LexComment();
      } else if (kind == '%' && IsRawBlock()) {
        line_starting = LexRaw();
      } else {
        line_starting = LexTag(kind);
      }
    }
    Emit(Token::Type::kEof, "", line_);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return src_.size();
  }

  void Advance(size_t to) {
    for (size_t i = pos_; i < to; ++i)
      if (src_[i] == '\n') ++line_;
    pos_ = to;
  }

  void Emit(Token::Type t, std::string text, int line) {
    tokens_.push_back(Token{t, std::move(text), line});
  }

  // Consumes the closing delimiter at pos_ ("-%}", "+%}", "%}", "-}}",
  // "}}", ...) and the whitespace it swallows. Returns whether the consumed
  // text ended a line (what lstrip_blocks calls line_starting).
  bool CloseTag(char kind, bool minus) {
    const char close = kind == '{' ? '}' : kind;
    size_t p = pos_ + (minus ? 1 : 0);
    if (!minus && src_[pos_] == '+') p = pos_ + 1;
    p += 2;  // the two-char delimiter
    (void)close;
    bool ends_line = false;
    if (minus) {
      size_t q = p;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      ends_line = q > p && src_[q - 1] == '\n';
      p = q;
    } else if (src_[pos_] != '+' && kind != '{' && opt_.trim_blocks && p < src_.size() &&
               src_[p] == '\n') {
      ++p;
      ends_line = true;
    }
    Advance(p);
    return ends_line;
  }

  bool LexComment() {
    int start = line_;
    for (size_t i = pos_; i + 1 < src_.size(); ++i) {
      if (src_[i] == '#' && src_[i + 1] == '}') {
        bool minus = i > pos_ && src_[i - 1] == '-';
        bool plus = i > pos_ && src_[i - 1] == '+';
        Advance(minus || plus ? i - 1 : i);
        return CloseTag('#', minus);
      }
    }
    SyntaxError("Missing end of comment tag", start);
  }

  bool IsRawBlock() const {
    size_t p = pos_;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0 ||
           src_.compare(p, 3, "+%}") == 0;
  }

  bool LexRaw() {
    int start = line_;
    size_t p = src_.find("%}", pos_);
    bool minus = src_[p - 1] == '-';
    Advance(p - (minus || src_[p - 1] == '+' ? 1 : 0));
    CloseTag('%', minus);
    // Find {% endraw %} allowing whitespace and -/+ markers.
    for (size_t i = pos_; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t q = i + 2;
      char sign = src_[q];
      if (sign == '-' || sign == '+') ++q;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      bool end_minus = src_[q] == '-';
      size_t close = q + ((end_minus || src_[q] == '+') ? 1 : 0);
      if (src_.compare(close, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, i - pos_);
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      }
      int text_line = line_;
      if (!text.empty()) Emit(Token::Type::kData, std::move(text), text_line);
      Advance(q);
      return CloseTag('%', end_minus);
    }
    SyntaxError("Missing end of raw directive", start);
  }

  // Lexes the inside of {{ }} or {% %} up to and including its end.
  bool LexTag(char kind) {
    const int start_line = line_;
    Emit(kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", line_);
    const char end1 = kind == '{' ? '}' : '%';
    int depth = 0;  // open brackets: a "}}" inside {...} is not the end
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) Advance(pos_ + 1);
      if (pos_ >= src_.size()) SyntaxError("unexpected end of template", start_line);
      char c = src_[pos_];
      // End of tag, possibly with a whitespace marker.
      if (depth == 0 || kind == '%') {
        bool minus = c == '-' && src_.compare(pos_ + 1, 1, std::string(1, end1)) == 0 &&
                     pos_ + 2 < src_.size() && src_[pos_ + 2] == '}';
        bool plus = kind == '%' && c == '+' && src_.compare(pos_ + 1, 2, "%}") == 0;
        bool plain = c == end1 && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}';
        if (minus || plus || plain) {
          Emit(kind == '{' ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line_);
          return CloseTag(kind, minus);
        }
      }
      int line = line_;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        Emit(Token::Type::kName, src_.substr(pos_, e - pos_), line);
        Advance(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber(line);
      } else if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < src_.size() && src_[e] != c) {
          if (src_[e] == '\\') ++e;
          ++e;
        }
        if (e >= src_.size()) SyntaxError("unexpected end of string", line);
        Emit(Token::Type::kString, Unescape(std::string_view(src_).substr(pos_ + 1, e - pos_ - 1)),
             line);
        Advance(e + 1);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                     ",",  ".",  ":",  "|",  "=",  "<",  ">", ";"};
        bool found = false;
        for (const char* op : kOps) {
          size_t n = std::char_traits<char>::length(op);
          if (src_.compare(pos_, n, op) == 0) {
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
            if (op[0] == ')' || op[0] == ']' || op[0] == '}') --depth;
            Emit(Token::Type::kOp, op, line);
            Advance(pos_ + n);
            found = true;
            break;
          }
        }
        if (!found) SyntaxError(std::string("unexpected char '") + c + "'", line);
      }
    }
  }

  void LexNumber(int line) {
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) ||
                                 (src_[e] == '_' && e + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[e + 1])))))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        e = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, std::move(text), line);
    Advance(e);
  }

  std::string src_;
  LexerOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(Normalize(source, options.keep_trailing_newline), options).Run();
}

}  // namespace agentkv::text::chat::jinja
