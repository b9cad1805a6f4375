#include "engine/grammar/json_lexical.h"

#include <algorithm>
#include <string>

namespace agentkv::grammar {

void EmitUtf8NonAscii(GrammarBuilder& b, int32_t from, int32_t to) {
  // RFC 3629, with continuation nodes needing 1, 2 or 3 more bytes.
  const int32_t c1 = b.NewNode(), c2 = b.NewNode(), c3 = b.NewNode();
  b.AddBytes(c1, 0x80, 0xBF, to);
  b.AddBytes(c2, 0x80, 0xBF, c1);
  b.AddBytes(c3, 0x80, 0xBF, c2);
  b.AddBytes(from, 0xC2, 0xDF, c1);
  const int32_t e0 = b.NewNode(), ed = b.NewNode(), f0 = b.NewNode(), f4 = b.NewNode();
  b.AddByte(from, 0xE0, e0);
  b.AddBytes(e0, 0xA0, 0xBF, c1);
  b.AddBytes(from, 0xE1, 0xEC, c2);
  b.AddByte(from, 0xED, ed);
  b.AddBytes(ed, 0x80, 0x9F, c1);
  b.AddBytes(from, 0xEE, 0xEF, c2);
  b.AddByte(from, 0xF0, f0);
  b.AddBytes(f0, 0x90, 0xBF, c2);
  b.AddBytes(from, 0xF1, 0xF3, c3);
  b.AddByte(from, 0xF4, f4);
  b.AddBytes(f4, 0x80, 0x8F, c2);
}

namespace {
void AddHex(GrammarBuilder& b, int32_t from, int32_t to) {
  b.AddBytes(from, '0', '9', to);
  b.AddBytes(from, 'a', 'f', to);
  b.AddBytes(from, 'A', 'F', to);
}
}  // namespace

void EmitJsonStringChar(GrammarBuilder& b, int32_t from, int32_t to) {
  b.AddBytes(from, 0x20, 0x21, to);
  b.AddBytes(from, 0x23, 0x5B, to);
  b.AddBytes(from, 0x5D, 0x7F, to);
  EmitUtf8NonAscii(b, from, to);
  const int32_t esc = b.NewNode();
  b.AddByte(from, '\\', esc);
  for (char c : std::string("\"\\/bfnrt")) b.AddByte(esc, static_cast<uint8_t>(c), to);
  // \uXXXX, surrogates (D800-DFFF) excluded: a pair would be one character
  // to a validator but two here.
  const int32_t u1 = b.NewNode(), u2 = b.NewNode(), u2low = b.NewNode(), u3 = b.NewNode(),
                u4 = b.NewNode();
  b.AddByte(esc, 'u', u1);
  b.AddBytes(u1, '0', '9', u2);
  b.AddBytes(u1, 'a', 'c', u2);
  b.AddBytes(u1, 'A', 'C', u2);
  b.AddBytes(u1, 'e', 'f', u2);
  b.AddBytes(u1, 'E', 'F', u2);
  b.AddByte(u1, 'd', u2low);
  b.AddByte(u1, 'D', u2low);
  AddHex(b, u2, u3);
  b.AddBytes(u2low, '0', '7', u3);
  AddHex(b, u3, u4);
  AddHex(b, u4, to);
}

void EmitJsonCharSet(GrammarBuilder& b, const std::bitset<128>& ascii, bool non_ascii, int32_t from,
                     int32_t to) {
  int c = 0;
  while (c < 128) {
    if (!ascii[static_cast<size_t>(c)]) {
      ++c;
      continue;
    }
    if (c < 0x20 || c == '"' || c == '\\') {
      std::string esc;
      switch (c) {
        case '"':
          esc = "\\\"";
          break;
        case '\\':
          esc = "\\\\";
          break;
        case '\n':
          esc = "\\n";
          break;
        case '\r':
          esc = "\\r";
          break;
        case '\t':
          esc = "\\t";
          break;
        case '\b':
          esc = "\\b";
          break;
        case '\f':
          esc = "\\f";
          break;
        default: {
          static const char* kHex = "0123456789abcdef";
          esc = std::string("\\u00") + kHex[c >> 4] + kHex[c & 15];
        }
      }
      b.AddLiteral(from, esc, to);
      ++c;
      continue;
    }
    int end = c;  // a run of raw bytes
    while (end + 1 < 128 && ascii[static_cast<size_t>(end + 1)] && end + 1 != '"' &&
           end + 1 != '\\')
      ++end;
    b.AddBytes(from, static_cast<uint8_t>(c), static_cast<uint8_t>(end), to);
    c = end + 1;
  }
  if (non_ascii) EmitUtf8NonAscii(b, from, to);
}

void EmitDigits(GrammarBuilder& b, int32_t n, int32_t from, int32_t to) {
  if (n < 0) {
    const int32_t loop = b.NewNode();
    b.AddEps(from, loop);
    b.AddBytes(loop, '0', '9', loop);
    b.AddEps(loop, to);
    return;
  }
  if (n == 0) {
    b.AddEps(from, to);
    return;
  }
  int32_t cur = from;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t next = i + 1 == n ? to : b.NewNode();
    b.AddBytes(cur, '0', '9', next);
    cur = next;
  }
}

namespace {

// Digit strings of equal length, x <= y.
void EmitFixedRange(GrammarBuilder& b, const std::string& x, const std::string& y, int32_t from,
                    int32_t to) {
  const size_t n = x.size();
  if (n == 1) {
    b.AddBytes(from, static_cast<uint8_t>(x[0]), static_cast<uint8_t>(y[0]), to);
    return;
  }
  const std::string xr = x.substr(1), yr = y.substr(1);
  if (x[0] == y[0]) {
    const int32_t mid = b.NewNode();
    b.AddByte(from, static_cast<uint8_t>(x[0]), mid);
    EmitFixedRange(b, xr, yr, mid, to);
    return;
  }
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  if (xr == zeros && yr == nines) {
    const int32_t mid = b.NewNode();
    b.AddBytes(from, static_cast<uint8_t>(x[0]), static_cast<uint8_t>(y[0]), mid);
    EmitDigits(b, static_cast<int32_t>(n - 1), mid, to);
    return;
  }
  int32_t mid = b.NewNode();
  b.AddByte(from, static_cast<uint8_t>(x[0]), mid);
  EmitFixedRange(b, xr, nines, mid, to);
  if (y[0] - x[0] >= 2) {
    mid = b.NewNode();
    b.AddBytes(from, static_cast<uint8_t>(x[0] + 1), static_cast<uint8_t>(y[0] - 1), mid);
    EmitDigits(b, static_cast<int32_t>(n - 1), mid, to);
  }
  mid = b.NewNode();
  b.AddByte(from, static_cast<uint8_t>(y[0]), mid);
  EmitFixedRange(b, zeros, yr, mid, to);
}

}  // namespace

void EmitUintRange(GrammarBuilder& b, uint64_t lo, uint64_t hi, int32_t from, int32_t to) {
  const size_t lo_len = std::to_string(lo).size(), hi_len = std::to_string(hi).size();
  uint64_t pow = 1;  // 10^(len-1)
  for (size_t i = 1; i < lo_len; ++i) pow *= 10;
  for (size_t len = lo_len; len <= hi_len; ++len) {
    const uint64_t first = len == 1 ? 0 : pow;
    const uint64_t last = len >= 20 ? UINT64_MAX : pow * 10 - 1;
    const uint64_t a = std::max(lo, first), z = std::min(hi, last);
    if (a <= z) EmitFixedRange(b, std::to_string(a), std::to_string(z), from, to);
    if (len < 20) pow *= 10;
  }
}

}  // namespace agentkv::grammar
