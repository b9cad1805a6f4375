// JsonStreamScanner: validates JSON one byte at a time (RFC 8259 syntax) and
// reports where keys and values begin and end, so a streaming parser can
// forward a value's raw bytes while they arrive and know when it closed.
//
// Not checked here (a full parse at the end does): UTF-8 validity and
// unpaired \u surrogates. Nesting deeper than kMaxDepth is an error.
//
// Thread-safety: none. Value type; Reset() to reuse.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace agentkv::text::output {

class JsonStreamScanner {
 public:
  static constexpr int kMaxDepth = 256;

  enum class Event : uint8_t { kKeyBegin, kKeyEnd, kValueBegin, kValueEnd };
  struct Mark {
    Event event;
    // Containers enclosing the key or value: 0 for the top-level value, 1
    // for a member of the top-level object, and so on.
    int depth;
    // True when the key/value ended just before this byte (a number is known
    // to end only at the byte after it); else the byte is part of it.
    bool before_byte;
  };

  // Feeds one byte; false on a syntax error (then failed() stays true). The
  // byte's marks are in marks() until the next Feed. After done(), any byte
  // other than whitespace is an error.
  bool Feed(char c);
  // Ends the input: completes a top-level number. False if incomplete.
  bool Finish();

  std::span<const Mark> marks() const { return {marks_.data(), num_marks_}; }
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kError; }
  int depth() const { return static_cast<int>(stack_.size()); }
  void Reset();

 private:
  enum class State : uint8_t {
    kValue,         // expecting a value
    kArrayFirst,    // after '[': a value or ']'
    kObjectFirst,   // after '{': a key or '}'
    kObjectKey,     // after ',' in an object: a key
    kColon,         // after a key
    kAfterValue,    // after a value: ',' or a closing bracket
    kString,        // inside a string (key or value)
    kEscape,        // after '\'
    kUnicode,       // inside \uXXXX
    kNumMinus,      // after '-'
    kNumZero,       // after a leading 0
    kNumInt,        // integer digits
    kNumDot,        // after '.'
    kNumFrac,       // fraction digits
    kNumExp,        // after 'e'
    kNumExpSign,    // after 'e+' / 'e-'
    kNumExpDigits,  // exponent digits
    kLiteral,       // inside true/false/null
    kDone,
    kError,
  };

  bool Step(char c);
  bool BeginValue(char c);
  bool EndValue(bool before_byte);  // then expects ',' / closer / end
  void AddMark(Event e, int depth, bool before);
  bool Fail();

  State state_ = State::kValue;
  std::vector<char> stack_;  // '{' or '['
  bool string_is_key_ = false;
  int unicode_left_ = 0;
  const char* literal_ = nullptr;  // remaining letters of true/false/null
  std::array<Mark, 4> marks_{};
  size_t num_marks_ = 0;
};

}  // namespace agentkv::text::output
