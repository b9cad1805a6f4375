// Parser: tokens to AST, following jinja2's grammar and operator precedence.
// Throws TemplateError (kSyntax) naming the line of the offending token.
#pragma once

#include <vector>

#include "engine/text/chat/jinja/ast.h"
#include "engine/text/chat/jinja/lexer.h"

namespace agentkv::text::chat::jinja {

NodeList Parse(const std::vector<Token>& tokens);

}  // namespace agentkv::text::chat::jinja
