// Lexer: splits template source into tokens the way jinja2's lexer does,
// including its whitespace rules: newline normalisation, the dropped final
// newline, "-"/"+" markers, trim_blocks and lstrip_blocks. Comments are
// dropped here. Throws TemplateError (kSyntax) with the line on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace agentkv::text::chat::jinja {

struct LexerOptions {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // strip spaces/tabs before a block tag on its line
  bool keep_trailing_newline = false;
};

struct Token {
  enum class Type : uint8_t {
    kData,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof,
  };
  Type type;
  std::string text;  // data, name, decoded string literal, operator, number text
  int line;
};

std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options);

}  // namespace agentkv::text::chat::jinja
