// `agentkv template`: renders the model's chat template for a conversation and
// prints the prompt exactly as the engine would see it (no newline added), to
// compare with transformers' apply_chat_template(tokenize=False).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "engine/text/chat/chat_template.h"

namespace agentkv::cli {
namespace {

struct TemplateArgs {
  std::string model, messages_file, tools_file, extra_json;
  bool no_generation_prompt = false;
};

bool ReadJson(const std::string& path, nlohmann::ordered_json& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "error: cannot read " << path << "\n";
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  out = nlohmann::ordered_json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) {
    std::cerr << "error: " << path << " is not valid JSON\n";
    return false;
  }
  return true;
}

int RunTemplate(const TemplateArgs& a) {
  text::chat::ChatTemplate::Input input;
  input.add_generation_prompt = !a.no_generation_prompt;
  nlohmann::ordered_json doc;
  if (!ReadJson(a.messages_file, doc)) return 1;
  // A bare list of messages, or a request body with "messages" (and "tools").
  if (doc.is_object() && doc.contains("messages")) {
    input.messages = doc["messages"];
    if (doc.contains("tools")) input.tools = doc["tools"];
  } else {
    input.messages = doc;
  }
  if (!input.messages.is_array()) {
    std::cerr << "error: " << a.messages_file << " must hold a JSON array of messages\n";
    return 1;
  }
  if (!a.tools_file.empty()) {
    if (!ReadJson(a.tools_file, input.tools)) return 1;
    if (input.tools.is_object() && input.tools.contains("tools")) {
      nlohmann::ordered_json t = input.tools["tools"];
      input.tools = std::move(t);
    }
  }
  if (!a.extra_json.empty()) {
    input.extra = nlohmann::ordered_json::parse(a.extra_json, nullptr, false);
    if (!input.extra.is_object()) {
      std::cerr << "error: --extra must be a JSON object\n";
      return 2;
    }
  }
  auto tmpl = text::chat::ChatTemplate::LoadFromModelDir(a.model);
  if (!tmpl.ok()) {
    std::cerr << "error: " << tmpl.status().ToString() << "\n";
    return 1;
  }
  auto out = tmpl->Render(input);
  if (!out.ok()) {
    std::cerr << "error: " << out.status().ToString() << "\n";
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  std::fflush(stdout);
  return 0;
}

Registrar reg("template", "Render the model's chat template for a conversation", [](CLI::App& app) {
  auto a = std::make_shared<TemplateArgs>();
  app.add_option("--model", a->model,
                 "Model directory (tokenizer_config.json / chat_template.jinja)")
      ->required();
  app.add_option("--messages-file", a->messages_file,
                 "JSON file: an array of messages, or an object with \"messages\" (and \"tools\")")
      ->required();
  app.add_option("--tools-file", a->tools_file, "JSON file: an array of OpenAI function tools");
  app.add_flag("--no-generation-prompt", a->no_generation_prompt,
               "Do not append the assistant turn header (add_generation_prompt=false)");
  app.add_option("--extra", a->extra_json,
                 "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  return [a] { return RunTemplate(*a); };
});

}  // namespace
}  // namespace agentkv::cli
