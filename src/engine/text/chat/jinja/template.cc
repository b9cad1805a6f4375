#include "engine/text/chat/jinja/template.h"

#include "engine/text/chat/jinja/error.h"
#include "engine/text/chat/jinja/parser.h"

namespace agentkv::text::chat::jinja {
namespace {

Status ToStatus(const TemplateError& e) {
  std::string where =
      e.line() > 0 ? "template line " + std::to_string(e.line()) + ": " : "template: ";
  std::string what;
  switch (e.kind()) {
    case TemplateError::Kind::kSyntax:
      what = "syntax error: ";
      break;
    case TemplateError::Kind::kUndefined:
      what = "undefined: ";
      break;
    case TemplateError::Kind::kRaised:
      what = "raise_exception: ";
      break;
    case TemplateError::Kind::kSecurity:
      what = "security error: ";
      break;
    default:
      break;
  }
  if (e.kind() == TemplateError::Kind::kLimit) return ResourceExhausted(where + e.what());
  return InvalidArgument(where + what + e.what());
}

}  // namespace

Result<Template> Template::Parse(std::string_view source, const LexerOptions& options) {
  try {
    auto body = std::make_shared<NodeList>(jinja::Parse(Tokenize(source, options)));
    return Template(std::move(body));
  } catch (const TemplateError& e) {
    return ToStatus(e);
  }
}

Result<std::string> Template::Render(const Value& context, const RenderOptions& options) const {
  if (!context.is_dict()) return InvalidArgument("template context must be a dict");
  Interpreter::Clock clock = options.clock;
  if (!clock) clock = [] { return std::chrono::system_clock::now(); };
  Interpreter in(options.limits, std::move(clock));
  try {
    return in.Render(*body_, context.dict());
  } catch (const TemplateError& e) {
    return ToStatus(e);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("template: out of memory while rendering");
  }
}

Result<std::string> Template::Render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options) const {
  return Render(Value::FromJson(context), options);
}

}  // namespace agentkv::text::chat::jinja
