#include "engine/grammar/json_regex.h"

#include <bitset>
#include <cctype>
#include <string>
#include <vector>

#include "engine/grammar/json_lexical.h"

namespace agentkv::grammar {
namespace {

struct Re {
  enum Kind { kSet, kBytes, kSeq, kAlt, kRepeat };
  Kind kind = kSeq;
  std::bitset<128> ascii;    // kSet
  bool non_ascii = false;    // kSet: any non-ASCII character too
  std::string bytes;         // kBytes: one literal non-ASCII character
  std::vector<Re> kids;      // kSeq, kAlt, kRepeat (one)
  int32_t min = 0, max = 0;  // kRepeat; max -1 = unbounded
};

Status Bad(const std::string& why) { return InvalidArgument("pattern: " + why); }

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Result<Re> Parse() {
    ASSIGN_OR_RETURN(Re re, ParseAlt(0));
    if (pos_ != p_.size()) return Bad("unbalanced ')'");
    return re;
  }
  bool anchored_start = false, anchored_end = false;

 private:
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  Result<Re> ParseAlt(int depth) {
    if (depth > 32) return Bad("groups nested deeper than 32");
    Re alt;
    alt.kind = Re::kAlt;
    while (true) {
      ASSIGN_OR_RETURN(Re seq, ParseSeq(depth));
      alt.kids.push_back(std::move(seq));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  Result<Re> ParseSeq(int depth) {
    Re seq;
    seq.kind = Re::kSeq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '^') {
        if (pos_ != 0) return Bad("'^' is supported only at the start");
        anchored_start = true;
        ++pos_;
        continue;
      }
      if (Peek() == '$') {
        if (pos_ + 1 != p_.size()) return Bad("'$' is supported only at the end");
        anchored_end = true;
        ++pos_;
        continue;
      }
      ASSIGN_OR_RETURN(Re atom, ParseAtom(depth));
      ASSIGN_OR_RETURN(Re q, ParseQuantifier(std::move(atom)));
      seq.kids.push_back(std::move(q));
    }
    return seq;
  }

  Result<int32_t> ParseCount() {
    size_t start = pos_;
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > kMaxRepeat) return Bad("a repeat count above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) return Bad("a '{' without a count");
    return static_cast<int32_t>(v);
  }

  Result<Re> ParseQuantifier(Re atom) {
    if (AtEnd()) return atom;
    int32_t mn, mx;
    const char c = Peek();
    if (c == '*') {
      mn = 0, mx = -1;
      ++pos_;
    } else if (c == '+') {
      mn = 1, mx = -1;
      ++pos_;
    } else if (c == '?') {
      mn = 0, mx = 1;
      ++pos_;
    } else if (c == '{') {
      ++pos_;
      ASSIGN_OR_RETURN(mn, ParseCount());
      mx = mn;
      if (!AtEnd() && Peek() == ',') {
        ++pos_;
        if (!AtEnd() && Peek() == '}') {
          mx = -1;
        } else {
          ASSIGN_OR_RETURN(mx, ParseCount());
        }
      }
      if (AtEnd() || Peek() != '}') return Bad("an unterminated '{'");
      ++pos_;
      if (mx >= 0 && mx < mn) return Bad("a repeat {n,m} with m < n");
    } else {
      return atom;
    }
    if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
    if (!AtEnd() && (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{'))
      return Bad("a quantifier after a quantifier");
    Re r;
    r.kind = Re::kRepeat;
    r.min = mn;
    r.max = mx;
    r.kids.push_back(std::move(atom));
    return r;
  }

  static Re Set(const std::bitset<128>& s, bool non_ascii) {
    Re r;
    r.kind = Re::kSet;
    r.ascii = s;
    r.non_ascii = non_ascii;
    return r;
  }

  // Class escapes (\d \w \s and negations): true with `set` filled.
  static bool ClassEscape(char c, std::bitset<128>* set, bool* negated) {
    std::bitset<128> s;
    switch (c) {
      case 'd':
      case 'D':
        for (int i = '0'; i <= '9'; ++i) s.set(static_cast<size_t>(i));
        break;
      case 'w':
      case 'W':
        for (int i = 0; i < 128; ++i)
          if (std::isalnum(i) || i == '_') s.set(static_cast<size_t>(i));
        break;
      case 's':
      case 'S':
        for (char w : std::string(" \t\n\r\f\v")) s.set(static_cast<size_t>(w));
        break;
      default:
        return false;
    }
    *negated = std::isupper(static_cast<unsigned char>(c)) != 0;
    *set = s;
    return true;
  }

  // One escaped single character (after the backslash); -1 if unsupported.
  Result<int> EscapedChar() {
    if (AtEnd()) return Bad("a trailing backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 't':
        return '\t';
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'u': {
        if (pos_ + 4 > p_.size()) return Bad("a short \\u escape");
        int v = 0;
        for (int i = 0; i < 4; ++i) {
          const char h = p_[pos_++];
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                    : (std::tolower(h) - 'a' + 10));
          if (!std::isxdigit(static_cast<unsigned char>(h))) return Bad("a bad \\u escape");
        }
        if (v >= 128) return Bad("\\u escapes of non-ASCII characters are not supported");
        return v;
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(c)))
          return Bad(std::string("the escape \\") + c + " is not supported");
        if (static_cast<unsigned char>(c) >= 128) return Bad("an escaped non-ASCII character");
        return static_cast<int>(c);
    }
  }

  Result<Re> ParseClass() {
    bool negated = false;
    if (!AtEnd() && Peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::bitset<128> s;
    bool neg_class_escape = false;  // \D \W \S inside: all non-ASCII too
    bool first = true;
    while (true) {
      if (AtEnd()) return Bad("an unterminated '['");
      char c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      int lo;
      if (c == '\\') {
        ++pos_;
        std::bitset<128> cs;
        bool neg;
        if (!AtEnd() && ClassEscape(Peek(), &cs, &neg)) {
          ++pos_;
          if (neg) {
            cs.flip();
            neg_class_escape = true;
          }
          s |= cs;
          continue;
        }
        ASSIGN_OR_RETURN(lo, EscapedChar());
      } else {
        if (static_cast<unsigned char>(c) >= 128)
          return Bad("non-ASCII characters in a class are not supported");
        lo = c;
        ++pos_;
      }
      int hi = lo;
      if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        const char d = Peek();
        if (d == '\\') {
          ++pos_;
          ASSIGN_OR_RETURN(hi, EscapedChar());
        } else {
          if (static_cast<unsigned char>(d) >= 128)
            return Bad("non-ASCII characters in a class are not supported");
          hi = d;
          ++pos_;
        }
        if (hi < lo) return Bad("a class range out of order");
      }
      for (int i = lo; i <= hi; ++i) s.set(static_cast<size_t>(i));
    }
    if (neg_class_escape && negated) return Bad("a negated class holding \\D, \\W or \\S");
    if (negated) return Set(~s, true);
    return Set(s, neg_class_escape);
  }

  Result<Re> ParseAtom(int depth) {
    const char c = Peek();
    if (c == '(') {
      ++pos_;
      if (!AtEnd() && Peek() == '?') {
        if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
          pos_ += 2;
        } else {
          return Bad("lookarounds and named groups are not supported");
        }
      }
      ASSIGN_OR_RETURN(Re inner, ParseAlt(depth + 1));
      if (AtEnd() || Peek() != ')') return Bad("an unterminated '('");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      ++pos_;
      return ParseClass();
    }
    if (c == '.') {
      ++pos_;
      std::bitset<128> s;
      s.set();
      s.reset('\n');
      s.reset('\r');
      return Set(s, true);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == '}' || c == ']')
      return Bad(std::string("a stray '") + c + "'");
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Bad("a trailing backslash");
      std::bitset<128> cs;
      bool neg;
      if (ClassEscape(Peek(), &cs, &neg)) {
        ++pos_;
        return neg ? Set(~cs, true) : Set(cs, false);
      }
      if (Peek() == 'b' || Peek() == 'B') return Bad("word boundaries are not supported");
      if (Peek() >= '1' && Peek() <= '9') return Bad("backreferences are not supported");
      ASSIGN_OR_RETURN(int ch, EscapedChar());
      std::bitset<128> s;
      s.set(static_cast<size_t>(ch));
      return Set(s, false);
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 128) {
      ++pos_;
      std::bitset<128> s;
      s.set(u);
      return Set(s, false);
    }
    // A literal non-ASCII character: its UTF-8 bytes.
    size_t len = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : u >= 0xC0 ? 2 : 0;
    if (len == 0 || pos_ + len > p_.size()) return Bad("invalid UTF-8");
    Re r;
    r.kind = Re::kBytes;
    r.bytes = std::string(p_.substr(pos_, len));
    pos_ += len;
    return r;
  }

  std::string_view p_;
  size_t pos_ = 0;
};

void Emit(GrammarBuilder& b, const Re& re, int32_t from, int32_t to) {
  if (!b.status().ok()) return;
  switch (re.kind) {
    case Re::kSet:
      EmitJsonCharSet(b, re.ascii, re.non_ascii, from, to);
      return;
    case Re::kBytes:
      b.AddLiteral(from, re.bytes, to);
      return;
    case Re::kAlt:
      for (const Re& k : re.kids) Emit(b, k, from, to);
      return;
    case Re::kSeq: {
      if (re.kids.empty()) {
        b.AddEps(from, to);
        return;
      }
      int32_t cur = from;
      for (size_t i = 0; i < re.kids.size(); ++i) {
        const int32_t next = i + 1 == re.kids.size() ? to : b.NewNode();
        Emit(b, re.kids[i], cur, next);
        cur = next;
      }
      return;
    }
    case Re::kRepeat: {
      const Re& k = re.kids[0];
      int32_t cur = from;
      for (int32_t i = 0; i < re.min; ++i) {
        const int32_t next = b.NewNode();
        Emit(b, k, cur, next);
        cur = next;
        if (!b.status().ok()) return;
      }
      if (re.max < 0) {
        // A fresh loop node, so the loop never reaches back into `cur`'s
        // other edges.
        const int32_t loop = b.NewNode();
        b.AddEps(cur, loop);
        Emit(b, k, loop, loop);
        b.AddEps(loop, to);
        return;
      }
      for (int32_t i = re.min; i < re.max; ++i) {
        b.AddEps(cur, to);
        const int32_t next = i + 1 == re.max ? to : b.NewNode();
        Emit(b, k, cur, next);
        cur = next;
        if (!b.status().ok()) return;
      }
      b.AddEps(cur, to);
      return;
    }
  }
}

}  // namespace

Status EmitJsonRegex(GrammarBuilder& b, std::string_view pattern, int32_t from, int32_t to) {
  if (pattern.size() > kMaxPatternBytes)
    return Bad("longer than " + std::to_string(kMaxPatternBytes) + " bytes");
  Parser p(pattern);
  ASSIGN_OR_RETURN(Re re, p.Parse());
  int32_t start = from, end = to;
  if (!p.anchored_start) {
    start = b.NewNode();
    b.AddEps(from, start);
    EmitJsonStringChar(b, start, start);
  }
  if (!p.anchored_end) {
    end = b.NewNode();
    EmitJsonStringChar(b, end, end);
    b.AddEps(end, to);
  }
  Emit(b, re, start, end);
  return b.status();
}

}  // namespace agentkv::grammar
