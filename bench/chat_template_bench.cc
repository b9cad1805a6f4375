// Rendering cost of a chat template, parsed once: a 50-message agent
// conversation (with tool calls and tool results) and 20 tool definitions
// through the Qwen3 template. Target: under 1 ms per render.
#include <benchmark/benchmark.h>

#include <string>

#include "engine/text/chat/chat_template.h"

namespace agentkv {
namespace {

using json = nlohmann::ordered_json;

json Tools(int n) {
  json tools = json::array();
  for (int i = 0; i < n; ++i) {
    json props = json::object();
    props["path"] = {{"type", "string"}, {"description", "Absolute path of the file to work on"}};
    props["limit"] = {{"type", "integer"}, {"description", "Maximum lines"}, {"minimum", 1}};
    props["pattern"] = {{"type", "string"}, {"description", "Regular expression to search for"}};
    props["options"] = {{"type", "object"},
                        {"properties",
                         {{"case_sensitive", {{"type", "boolean"}}},
                          {"context", {{"type", "number"}, {"default", 0.5}}}}}};
    tools.push_back(
        {{"type", "function"},
         {"function",
          {{"name", "tool_" + std::to_string(i)},
           {"description", "Does task number " + std::to_string(i) +
                               " on the workspace. Use it when the user asks for it; "
                               "it returns a JSON report."},
           {"parameters", {{"type", "object"}, {"properties", props}, {"required", {"path"}}}}}}});
  }
  return tools;
}

json Messages(int n) {
  json msgs = json::array();
  msgs.push_back(
      {{"role", "system"},
       {"content", "You are a careful coding assistant working in a large repository."}});
  int i = 0;
  while (static_cast<int>(msgs.size()) < n - 1) {
    msgs.push_back({{"role", "user"},
                    {"content", "Please look at src/module_" + std::to_string(i) +
                                    ".cc and fix the failing test; keep the style."}});
    msgs.push_back({{"role", "assistant"},
                    {"content", ""},
                    {"reasoning_content", "The test fails because of an off-by-one in the loop."},
                    {"tool_calls",
                     {{{"type", "function"},
                       {"function",
                        {{"name", "tool_" + std::to_string(i % 20)},
                         {"arguments", {{"path", "/repo/src/module.cc"}, {"limit", 200}}}}}}}}});
    msgs.push_back({{"role", "tool"},
                    {"content", std::string(400, 'x') + "\nline 12: for (i = 0; i <= n; ++i)"}});
    msgs.push_back(
        {{"role", "assistant"}, {"content", "I changed `<=` to `<` on line 12; the test passes."}});
    ++i;
  }
  while (static_cast<int>(msgs.size()) > n - 1) msgs.erase(msgs.size() - 1);
  msgs.push_back({{"role", "user"}, {"content", "Thanks. Now run the whole suite."}});
  return msgs;
}

void BM_RenderQwen3_50Messages20Tools(benchmark::State& state) {
  auto tmpl = text::chat::ChatTemplate::LoadFromModelDir(std::string(AGENTKV_DATA_DIR) +
                                                         "/tokenizers/qwen3");
  if (!tmpl.ok()) {
    state.SkipWithError(tmpl.status().ToString().c_str());
    return;
  }
  text::chat::ChatTemplate::Input in;
  in.messages = Messages(50);
  in.tools = Tools(20);
  size_t bytes = 0;
  for (auto _ : state) {
    auto out = tmpl->Render(in);
    if (!out.ok()) {
      state.SkipWithError(out.status().ToString().c_str());
      return;
    }
    bytes = out->size();
    benchmark::DoNotOptimize(out->data());
  }
  state.counters["prompt_bytes"] = static_cast<double>(bytes);
  state.counters["messages"] = static_cast<double>(in.messages.size());
}
BENCHMARK(BM_RenderQwen3_50Messages20Tools)->Unit(benchmark::kMicrosecond);

void BM_ParseQwen3Template(benchmark::State& state) {
  const std::string dir = std::string(AGENTKV_DATA_DIR) + "/tokenizers/qwen3";
  for (auto _ : state) {
    auto tmpl = text::chat::ChatTemplate::LoadFromModelDir(dir);
    benchmark::DoNotOptimize(tmpl.ok());
  }
}
BENCHMARK(BM_ParseQwen3Template)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace agentkv
