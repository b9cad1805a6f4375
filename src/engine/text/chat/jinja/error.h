// TemplateError: the exception the lexer, parser and interpreter throw inside
// the jinja library. It never leaves the library: Template converts it to a
// Status naming the template line.
#pragma once

#include <stdexcept>
#include <string>

namespace agentkv::text::chat::jinja {

class TemplateError : public std::runtime_error {
 public:
  enum class Kind { kSyntax, kRuntime, kUndefined, kRaised, kSecurity, kLimit };
  TemplateError(Kind kind, std::string message, int line = 0)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  Kind kind() const { return kind_; }
  int line() const { return line_; }
  void set_line(int line) {
    if (line_ == 0) line_ = line;
  }

 private:
  Kind kind_;
  int line_;
};

[[noreturn]] inline void ThrowRuntime(std::string message) {
  throw TemplateError(TemplateError::Kind::kRuntime, std::move(message));
}

}  // namespace agentkv::text::chat::jinja
