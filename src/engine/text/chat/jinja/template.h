// Template: a parsed Jinja2 template, rendered as jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]) renders it, with transformers' tojson,
// raise_exception and strftime_now. Parse once, render many times; Render is
// const and safe to call from several threads at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/text/chat/jinja/interpreter.h"
#include "engine/text/chat/jinja/lexer.h"
#include "engine/text/chat/jinja/value.h"
#include "util/status.h"

namespace agentkv::text::chat::jinja {

struct RenderOptions {
  RenderLimits limits;
  // strftime_now's clock; the system clock when empty. Tests inject a fixed time.
  std::function<std::chrono::system_clock::time_point()> clock;
};

class Template {
 public:
  // Errors: InvalidArgument "template line N: <syntax error>".
  static Result<Template> Parse(std::string_view source, const LexerOptions& options = {});

  // Renders with `context` (a dict; its keys become variables). Errors:
  // InvalidArgument "template line N: <message>" for a template error or a
  // raise_exception() call, ResourceExhausted for a limit that was hit.
  Result<std::string> Render(const Value& context, const RenderOptions& options = {}) const;
  Result<std::string> Render(const nlohmann::ordered_json& context,
                             const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const NodeList> body) : body_(std::move(body)) {}
  std::shared_ptr<const NodeList> body_;
};

}  // namespace agentkv::text::chat::jinja
