// Fuzzes rendering of client-controlled variables with the shipped chat
// templates (data/tokenizers/*/tokenizer_config.json): the first byte picks
// the template, the rest is JSON, used as the messages (an array) or as
// {messages, tools, add_generation_prompt, extra} (an object), the way the
// API adapters pass request content to the template. Bodies nested deeper
// than the server's limit (64) are skipped: the server refuses them first.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/json_depth.h"
#include "engine/text/chat/chat_template.h"

namespace {

const std::vector<agentkv::text::chat::ChatTemplate>& Templates() {
  static const std::vector<agentkv::text::chat::ChatTemplate> templates = [] {
    std::vector<agentkv::text::chat::ChatTemplate> t;
    for (const char* name : {"qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss"}) {
      const std::string dir = std::string(AGENTKV_DATA_DIR) + "/tokenizers/" + name;
      auto loaded = agentkv::text::chat::ChatTemplate::LoadFromModelDir(dir);
      if (!loaded.ok()) {
        std::fprintf(stderr, "fuzz: %s: %s\n", dir.c_str(), loaded.status().ToString().c_str());
        std::abort();
      }
      t.push_back(std::move(loaded).value());
    }
    return t;
  }();
  return templates;
}

}  // namespace

// Loads before fuzzing starts, so the first input is not a slow unit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Templates();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& templates = Templates();
  const agentkv::text::chat::ChatTemplate& tmpl = templates[data[0] % templates.size()];
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (agentkv::api::JsonNestingDepth(text, 64) > 64) return 0;
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  agentkv::text::chat::ChatTemplate::Input input;
  if (j.is_array()) {
    input.messages = std::move(j);
  } else if (j.is_object()) {
    if (j.contains("messages")) input.messages = j["messages"];
    if (j.contains("tools")) input.tools = j["tools"];
    if (j.contains("add_generation_prompt")) {
      input.add_generation_prompt =
          j["add_generation_prompt"].is_boolean() && j["add_generation_prompt"].get<bool>();
    }
    if (j.contains("extra") && j["extra"].is_object()) input.extra = j["extra"];
  } else {
    return 0;
  }
  agentkv::text::chat::jinja::RenderOptions options;
  options.limits.max_output_bytes = 4 << 20;
  options.limits.max_steps = 1'000'000;
  options.clock = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1)); };
  (void)tmpl.Render(input, options);
  return 0;
}
