// ChatTemplate: a model's Hugging Face chat template, parsed once and rendered
// with the variables transformers' apply_chat_template passes (messages,
// tools, documents, add_generation_prompt, the tokenizer's special tokens and
// any extra keyword arguments), so the prompt is byte-identical to Python's.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "engine/text/chat/jinja/template.h"
#include "util/status.h"

namespace agentkv::text::chat {

class ChatTemplate {
 public:
  struct Input {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    // OpenAI function schemas; null means "no tools" (the template sees None).
    nlohmann::ordered_json tools = nullptr;
    bool add_generation_prompt = true;
    // Extra template variables (e.g. {"enable_thinking": false}); they win
    // over everything else, as transformers' **kwargs do.
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  };

  // Loads `dir`/chat_template.jinja if present, else the `chat_template` of
  // `dir`/tokenizer_config.json (a string, or a list of {name, template}).
  // Special tokens come from tokenizer_config.json. Errors: NotFound when the
  // model has no chat template, InvalidArgument for a template that fails to parse.
  static Result<ChatTemplate> LoadFromModelDir(const std::string& dir);

  // `tokenizer_config` supplies the special tokens (and named templates if
  // `source` is empty); it may be an empty object.
  static Result<ChatTemplate> FromSource(const std::string& source,
                                         const nlohmann::ordered_json& tokenizer_config);

  // Errors: InvalidArgument naming the template line (including the
  // template's own raise_exception), ResourceExhausted for runaway templates.
  Result<std::string> Render(const Input& input, const jinja::RenderOptions& options = {}) const;

  // The template source used when tools are (or are not) given.
  const std::string& source(bool with_tools = false) const {
    return with_tools && has_tool_use_ ? tool_use_source_ : source_;
  }

 private:
  ChatTemplate() = default;
  static Result<ChatTemplate> Build(const nlohmann::ordered_json& config, std::string source);

  std::string source_;
  std::string tool_use_source_;
  bool has_tool_use_ = false;
  std::shared_ptr<const jinja::Template> template_;
  std::shared_ptr<const jinja::Template> tool_use_template_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace agentkv::text::chat
