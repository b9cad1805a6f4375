// Fuzzes the Jinja engine with template sources: lexing, parsing, and
// rendering what parses with a chat-like context (messages with tool calls,
// tools, special tokens), under tight render limits so a runaway loop ends
// in ResourceExhausted rather than a timeout. Seeds are the shipped models'
// chat templates.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/text/chat/jinja/template.h"

namespace {

const nlohmann::ordered_json& Context() {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "What is 2+2? <think>"},
      {"role": "assistant", "content": "<think>\nadd\n</think>\n4", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "calc", "arguments": {"expr": "2+2"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "4"},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "calc", "description": "math",
      "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                     "required": ["expr"]}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false
  })");
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view source(reinterpret_cast<const char*>(data), size);
  auto parsed = agentkv::text::chat::jinja::Template::Parse(source);
  if (!parsed.ok()) return 0;
  agentkv::text::chat::jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_steps = 200'000;
  options.clock = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1)); };
  (void)parsed->Render(Context(), options);
  return 0;
}
