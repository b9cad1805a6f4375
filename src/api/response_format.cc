#include "api/response_format.h"

#include "engine/grammar/harmony_grammar.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/think_grammar.h"

namespace agentkv::api {
namespace {

bool IsHarmony(const ServedModel& model) { return model.model_type() == "gpt_oss"; }

// For a harmony model: `content` as the final channel's message.
Result<std::shared_ptr<const grammar::Grammar>> AsHarmonyFinal(
    std::shared_ptr<const grammar::Grammar> content, const ServedModel& model) {
  if (!IsHarmony(model)) return content;
  auto tokens = grammar::HarmonyTokens::Find(model.tokenizer());
  if (!tokens.ok()) return tokens.status().WithContext("response_format");
  auto g = grammar::CompileHarmonyFinalGrammar(*content, *tokens, model.grammar_vocab());
  if (!g.ok()) return g.status().WithContext("response_format");
  return *g;
}

// A chat reply's grammar with the reasoning block where the prompt leaves
// room for one.
Result<std::shared_ptr<const grammar::Grammar>> ChatReply(std::shared_ptr<const grammar::Grammar> g,
                                                          const ServedModel& model,
                                                          const std::string* prompt_text) {
  ASSIGN_OR_RETURN(g, AsHarmonyFinal(std::move(g), model));
  if (prompt_text == nullptr) return g;
  return WithThinkingBlock(std::move(g), model, *prompt_text);
}

}  // namespace

Result<std::shared_ptr<const grammar::Grammar>> WithThinkingBlock(
    std::shared_ptr<const grammar::Grammar> g, const ServedModel& model,
    std::string_view prompt_text) {
  if (!g || model.model_type() != "qwen3") return g;
  const grammar::ThinkStart start = grammar::ThinkStartOf(prompt_text);
  if (start == grammar::ThinkStart::kNone) return g;
  auto t = grammar::CompileThinkThenGrammar(*g, start, model.grammar_vocab());
  if (!t.ok()) return t.status().WithContext("reasoning block");
  return *t;
}

Result<std::shared_ptr<const grammar::Grammar>> ParseResponseFormat(
    std::string_view raw_body, const nlohmann::json& body, const ServedModel& model, bool chat,
    const std::string* prompt_text) {
  if (!body.contains("response_format") || body["response_format"].is_null())
    return std::shared_ptr<const grammar::Grammar>();
  const nlohmann::json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return InvalidArgument("'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::shared_ptr<const grammar::Grammar>();
  if (type == "json_object") {
    auto g = grammar::CompileAnyJsonObject(model.grammar_vocab());
    if (!g.ok()) return g.status().WithContext("response_format");
    if (!chat) return *g;
    auto r = ChatReply(*g, model, prompt_text);
    if (!r.ok()) return r.status().WithContext("response_format");
    return r;
  }
  if (type != "json_schema")
    return InvalidArgument("'response_format.type' must be text, json_object or json_schema");
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    return InvalidArgument("'response_format.json_schema' must be an object");
  const nlohmann::json& js = rf["json_schema"];
  if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
    return InvalidArgument("'response_format.json_schema.strict' must be a boolean");
  if (js.contains("name") && !js["name"].is_null() && !js["name"].is_string())
    return InvalidArgument("'response_format.json_schema.name' must be a string");
  if (!js.contains("schema") || js["schema"].is_null())
    return InvalidArgument("'response_format.json_schema.schema' is required");
  // The same request again, keeping the schema's key order.
  const auto ordered = nlohmann::ordered_json::parse(raw_body, nullptr, false);
  nlohmann::ordered_json schema;
  if (!ordered.is_discarded() && ordered.is_object())
    schema = ordered["response_format"]["json_schema"]["schema"];
  else
    schema = nlohmann::ordered_json(js["schema"]);
  auto g = grammar::CompileJsonSchema(schema, model.grammar_vocab());
  if (!g.ok()) return g.status().WithContext("response_format.json_schema.schema");
  if (!chat) return *g;
  auto r = ChatReply(*g, model, prompt_text);
  if (!r.ok()) return r.status().WithContext("response_format");
  return r;
}

Result<std::shared_ptr<const grammar::Grammar>> ToolCallGrammar(ToolProtocol protocol,
                                                                const nlohmann::ordered_json& tools,
                                                                const nlohmann::json& body,
                                                                const ServedModel& model,
                                                                const std::string* prompt_text) {
  const auto none = std::shared_ptr<const grammar::Grammar>();
  if (!tools.is_array() || tools.empty()) return none;
  bool required = false;
  std::optional<std::string> only;
  const nlohmann::json choice =
      body.contains("tool_choice") ? body["tool_choice"] : nlohmann::json(nullptr);
  if (protocol == ToolProtocol::kAnthropic) {
    if (choice.is_object() && choice.contains("type") && choice["type"].is_string()) {
      const std::string type = choice["type"].get<std::string>();
      if (type == "any") required = true;
      if (type == "tool") {
        if (!choice.contains("name") || !choice["name"].is_string())
          return InvalidArgument("tool_choice: type tool needs a string 'name'");
        required = true;
        only = choice["name"].get<std::string>();
      }
    }
  } else if (choice.is_string()) {
    if (choice == "required") required = true;
  } else if (choice.is_object()) {
    if (!choice.contains("function") || !choice["function"].is_object() ||
        !choice["function"].contains("name") || !choice["function"]["name"].is_string())
      return InvalidArgument("tool_choice: an object needs function.name");
    required = true;
    only = choice["function"]["name"].get<std::string>();
  }
  std::vector<grammar::ToolGrammarSpec> specs;
  bool any_strict = false;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string()) continue;
    const std::string name = f["name"].get<std::string>();
    if (only && name != *only) continue;
    grammar::ToolGrammarSpec s;
    s.name = name;
    s.parameters = f.contains("parameters") && !f["parameters"].is_null()
                       ? f["parameters"]
                       : nlohmann::ordered_json{{"type", "object"}};
    const bool strict = f.contains("strict") && f["strict"].is_boolean() && f["strict"].get<bool>();
    s.constrain_arguments = protocol == ToolProtocol::kAnthropic || strict;
    any_strict = any_strict || strict;
    specs.push_back(std::move(s));
  }
  if (only && specs.empty())
    return InvalidArgument("tool_choice: no tool named \"" + *only + "\" in tools");
  if (!required && !any_strict) return none;
  if (specs.empty()) return InvalidArgument("tool_choice: no function tools to call");
  if (body.contains("response_format") && !body["response_format"].is_null())
    return InvalidArgument(
        "response_format cannot be combined with a required or strict tool call");
  if (IsHarmony(model)) {
    auto tokens = grammar::HarmonyTokens::Find(model.tokenizer());
    if (!tokens.ok()) return tokens.status().WithContext("tools");
    auto g =
        grammar::CompileHarmonyToolCallGrammar(specs, required, *tokens, model.grammar_vocab());
    if (!g.ok()) return g.status().WithContext("tools");
    return *g;
  }
  grammar::ToolGrammarOptions o;
  o.required = required;
  const std::string& mt = model.model_type();
  if (mt == "qwen3" || mt == "qwen2") {
    o.syntax = grammar::ToolCallSyntax::kHermes;
  } else if (mt == "llama") {
    o.syntax = grammar::ToolCallSyntax::kLlama31Json;
  } else if (mt == "gemma3" || mt == "gemma3_text") {
    o.syntax = grammar::ToolCallSyntax::kGemmaFenced;
  } else {
    return InvalidArgument(
        "tool_choice: constrained tool calls are not supported for model type \"" + mt + "\"");
  }
  auto g = grammar::CompileToolCallGrammar(specs, o, model.grammar_vocab());
  if (!g.ok()) return g.status().WithContext("tools");
  if (!required || prompt_text == nullptr) return *g;
  auto t = WithThinkingBlock(*g, model, *prompt_text);
  if (!t.ok()) return t.status().WithContext("tools");
  return t;
}

}  // namespace agentkv::api
