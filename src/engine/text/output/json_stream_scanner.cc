#include "engine/text/output/json_stream_scanner.h"

#include "engine/text/output/partial_match.h"

namespace agentkv::text::output {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

void JsonStreamScanner::Reset() {
  state_ = State::kValue;
  stack_.clear();
  string_is_key_ = false;
  unicode_left_ = 0;
  literal_ = nullptr;
  num_marks_ = 0;
}

void JsonStreamScanner::AddMark(Event e, int depth, bool before) {
  if (num_marks_ < marks_.size()) marks_[num_marks_++] = {e, depth, before};
}

bool JsonStreamScanner::Fail() {
  state_ = State::kError;
  return false;
}

bool JsonStreamScanner::Feed(char c) {
  num_marks_ = 0;
  if (state_ == State::kError) return false;
  return Step(c);
}

bool JsonStreamScanner::Finish() {
  num_marks_ = 0;
  switch (state_) {
    case State::kNumZero:
    case State::kNumInt:
    case State::kNumFrac:
    case State::kNumExpDigits:
      if (!stack_.empty()) return Fail();
      AddMark(Event::kValueEnd, 0, true);
      state_ = State::kDone;
      return true;
    case State::kDone:
      return true;
    default:
      return Fail();
  }
}

bool JsonStreamScanner::BeginValue(char c) {
  const int d = depth();
  switch (c) {
    case '{':
    case '[':
      if (d >= kMaxDepth) return Fail();
      AddMark(Event::kValueBegin, d, false);
      stack_.push_back(c);
      state_ = c == '{' ? State::kObjectFirst : State::kArrayFirst;
      return true;
    case '"':
      AddMark(Event::kValueBegin, d, false);
      string_is_key_ = false;
      state_ = State::kString;
      return true;
    case '-':
      AddMark(Event::kValueBegin, d, false);
      state_ = State::kNumMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      AddMark(Event::kValueBegin, d, false);
      literal_ = c == 't' ? "rue" : c == 'f' ? "alse" : "ull";
      state_ = State::kLiteral;
      return true;
    default:
      if (IsDigit(c)) {
        AddMark(Event::kValueBegin, d, false);
        state_ = c == '0' ? State::kNumZero : State::kNumInt;
        return true;
      }
      return Fail();
  }
}

bool JsonStreamScanner::EndValue(bool before_byte) {
  AddMark(Event::kValueEnd, depth(), before_byte);
  state_ = stack_.empty() ? State::kDone : State::kAfterValue;
  return true;
}

bool JsonStreamScanner::Step(char c) {
  switch (state_) {
    case State::kValue:
      if (IsJsonSpace(c)) return true;
      return BeginValue(c);
    case State::kArrayFirst:
      if (IsJsonSpace(c)) return true;
      if (c == ']') {
        stack_.pop_back();
        return EndValue(false);
      }
      return BeginValue(c);
    case State::kObjectFirst:
    case State::kObjectKey:
      if (IsJsonSpace(c)) return true;
      if (c == '}' && state_ == State::kObjectFirst) {
        stack_.pop_back();
        return EndValue(false);
      }
      if (c != '"') return Fail();
      AddMark(Event::kKeyBegin, depth(), false);
      string_is_key_ = true;
      state_ = State::kString;
      return true;
    case State::kColon:
      if (IsJsonSpace(c)) return true;
      if (c != ':') return Fail();
      state_ = State::kValue;
      return true;
    case State::kAfterValue:
      if (IsJsonSpace(c)) return true;
      if (c == ',') {
        state_ = stack_.back() == '{' ? State::kObjectKey : State::kValue;
        return true;
      }
      if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
        stack_.pop_back();
        return EndValue(false);
      }
      return Fail();
    case State::kString:
      if (c == '"') {
        if (string_is_key_) {
          AddMark(Event::kKeyEnd, depth(), false);
          state_ = State::kColon;
          return true;
        }
        return EndValue(false);
      }
      if (c == '\\') {
        state_ = State::kEscape;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail();
      return true;
    case State::kEscape:
      switch (c) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          state_ = State::kString;
          return true;
        case 'u':
          unicode_left_ = 4;
          state_ = State::kUnicode;
          return true;
        default:
          return Fail();
      }
    case State::kUnicode:
      if (!IsHex(c)) return Fail();
      if (--unicode_left_ == 0) state_ = State::kString;
      return true;
    case State::kNumMinus:
      if (!IsDigit(c)) return Fail();
      state_ = c == '0' ? State::kNumZero : State::kNumInt;
      return true;
    case State::kNumInt:
      if (IsDigit(c)) return true;
      [[fallthrough]];
    case State::kNumZero:
      if (c == '.') {
        state_ = State::kNumDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::kNumExp;
        return true;
      }
      EndValue(true);
      return Step(c);  // the byte after the number belongs to what follows
    case State::kNumDot:
      if (!IsDigit(c)) return Fail();
      state_ = State::kNumFrac;
      return true;
    case State::kNumFrac:
      if (IsDigit(c)) return true;
      if (c == 'e' || c == 'E') {
        state_ = State::kNumExp;
        return true;
      }
      EndValue(true);
      return Step(c);
    case State::kNumExp:
      if (c == '+' || c == '-') {
        state_ = State::kNumExpSign;
        return true;
      }
      [[fallthrough]];
    case State::kNumExpSign:
      if (!IsDigit(c)) return Fail();
      state_ = State::kNumExpDigits;
      return true;
    case State::kNumExpDigits:
      if (IsDigit(c)) return true;
      EndValue(true);
      return Step(c);
    case State::kLiteral:
      if (c != *literal_) return Fail();
      if (*++literal_ == '\0') return EndValue(false);
      return true;
    case State::kDone:
      if (IsJsonSpace(c)) return true;
      return Fail();
    case State::kError:
      return false;
  }
  return Fail();
}

}  // namespace agentkv::text::output
