#include "engine/text/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace agentkv::text::chat {
namespace {

Result<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What tokenizer.special_tokens_map contributes: set tokens only, AddedToken
// objects reduced to their text.
nlohmann::ordered_json SpecialTokens(const nlohmann::ordered_json& config) {
  auto text = [](const nlohmann::ordered_json& t) -> std::string {
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string())
      return t["content"].get<std::string>();
    return "";
  };
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    std::string t = text(config[key]);
    if (!t.empty()) out[key] = t;
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array() &&
      !config["additional_special_tokens"].empty()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : config["additional_special_tokens"]) list.push_back(text(t));
    out["additional_special_tokens"] = std::move(list);
  }
  return out;
}

Result<std::shared_ptr<const jinja::Template>> Compile(const std::string& source,
                                                       const std::string& what) {
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status().WithContext(what);
  return std::make_shared<const jinja::Template>(std::move(t).value());
}

}  // namespace

Result<ChatTemplate> ChatTemplate::LoadFromModelDir(const std::string& dir) {
  namespace fs = std::filesystem;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return InvalidArgument(config_path.string() + " is not a JSON object");
  }
  std::string source;
  fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    ASSIGN_OR_RETURN(source, ReadFile(jinja_path));
  }
  return Build(config, std::move(source));
}

Result<ChatTemplate> ChatTemplate::FromSource(const std::string& source,
                                              const nlohmann::ordered_json& tokenizer_config) {
  return Build(tokenizer_config.is_object() ? tokenizer_config : nlohmann::ordered_json::object(),
               source);
}

Result<ChatTemplate> ChatTemplate::Build(const nlohmann::ordered_json& config, std::string source) {
  ChatTemplate ct;
  if (source.empty() && config.contains("chat_template")) {
    const auto& t = config["chat_template"];
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {
      // Named templates: "default" for plain chats, "tool_use" when tools are given.
      for (const auto& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["template"].is_string())
          continue;
        if (entry["name"] == "default") source = entry["template"].get<std::string>();
        if (entry["name"] == "tool_use") {
          ct.tool_use_source_ = entry["template"].get<std::string>();
          ct.has_tool_use_ = true;
        }
      }
      if (source.empty() && !ct.has_tool_use_)
        return InvalidArgument("chat_template list has no \"default\" entry");
    }
  }
  if (source.empty() && !ct.has_tool_use_) return NotFound("the model has no chat template");
  ct.source_ = std::move(source);
  if (!ct.source_.empty()) {
    ASSIGN_OR_RETURN(ct.template_, Compile(ct.source_, "chat template"));
  }
  if (ct.has_tool_use_) {
    ASSIGN_OR_RETURN(ct.tool_use_template_, Compile(ct.tool_use_source_, "tool_use chat template"));
  }
  ct.special_tokens_ = SpecialTokens(config);
  return ct;
}

Result<std::string> ChatTemplate::Render(const Input& input,
                                         const jinja::RenderOptions& options) const {
  const bool with_tools = !input.tools.is_null();
  const jinja::Template* t = template_.get();
  if (with_tools && tool_use_template_) t = tool_use_template_.get();
  if (!t) t = tool_use_template_.get();
  if (!input.messages.is_array()) return InvalidArgument("messages must be a JSON array");
  // Built as a Value directly: converting the conversation once is most of
  // the per-request cost outside the interpreter.
  auto ctx = std::make_shared<jinja::DictObj>();
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it)
    ctx->Set(jinja::Value::Str(it.key()), jinja::Value::FromJson(it.value()));
  ctx->Set(jinja::Value::Str("messages"), jinja::Value::FromJson(input.messages));
  ctx->Set(jinja::Value::Str("tools"), jinja::Value::FromJson(input.tools));
  ctx->Set(jinja::Value::Str("documents"), jinja::Value::None());
  ctx->Set(jinja::Value::Str("add_generation_prompt"),
           jinja::Value::Bool(input.add_generation_prompt));
  if (input.extra.is_object())
    for (auto it = input.extra.begin(); it != input.extra.end(); ++it)
      ctx->Set(jinja::Value::Str(it.key()), jinja::Value::FromJson(it.value()));
  return t->Render(jinja::Value::MakeDict(std::move(ctx)), options);
}

}  // namespace agentkv::text::chat
