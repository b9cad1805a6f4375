// Chat templates of real models (Qwen3, Llama 3.1, Gemma 3, DeepSeek V3, and
// agentkv's harmony template for GPT-OSS)
// rendered by agentkv against Python jinja2 called as transformers calls it,
// on seeded random conversations; plus the template loader's choices.
#include "engine/text/chat/chat_template.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "jinja/reference_util.h"

namespace agentkv::text::chat {
namespace {

namespace jt = jinja::testing;
constexpr int64_t kFixedTimestamp = 1722001506;  // hf_env.FIXED_TIMESTAMP

jinja::RenderOptions FixedClock() {
  jinja::RenderOptions o;
  o.clock = [] { return std::chrono::system_clock::from_time_t(kFixedTimestamp); };
  return o;
}

class ChatTemplateReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateReferenceTest, MatchesPythonOnSeededConversations) {
  const std::string model = GetParam();
  const std::string dir = std::string(AGENTKV_DATA_DIR) + "/tokenizers/" + model;
  if (!std::filesystem::exists(dir + "/tokenizer_config.json"))
    GTEST_SKIP() << dir << " is missing; run scripts/setup.sh";
  if (model == "gptoss" && !std::filesystem::exists(dir + "/chat_template.jinja"))
    GTEST_SKIP() << dir << "/chat_template.jinja is missing; run scripts/setup.sh";
  if (!jt::HaveReferenceJinja()) GTEST_SKIP() << "python3-jinja2 is not installed";
  std::string out =
      jt::RunPython(std::string(AGENTKV_SOURCE_DIR) + "/tests/reference/jinja/gen_chat_cases.py " +
                    AGENTKV_DATA_DIR + " --seed 1234 --count 220 --models " + model);
  ASSERT_FALSE(out.empty()) << "gen_chat_cases.py failed";
  auto cases = nlohmann::ordered_json::parse(out)["cases"];
  ASSERT_GE(cases.size(), 200u);

  auto tmpl = ChatTemplate::LoadFromModelDir(dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  int failures = 0, errors_expected = 0, with_tools = 0, tool_calls = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    ChatTemplate::Input in;
    in.messages = c["messages"];
    in.tools = c["tools"];
    in.add_generation_prompt = c["add_generation_prompt"];
    in.extra = c["extra"];
    with_tools += !in.tools.is_null();
    for (const auto& m : in.messages) tool_calls += m.contains("tool_calls");
    auto got = tmpl->Render(in, FixedClock());
    if (c.contains("error")) {
      ++errors_expected;
      if (got.ok()) {
        ADD_FAILURE() << model << " case " << i << ": python failed ("
                      << c["error"].get<std::string>() << ") but C++ rendered";
        ++failures;
      }
      continue;
    }
    const std::string want = c["output"];
    if (!got.ok()) {
      ADD_FAILURE() << model << " case " << i << ": C++ failed: " << got.status().ToString()
                    << "\nmessages: " << in.messages.dump();
      ++failures;
    } else if (*got != want) {
      ADD_FAILURE() << model << " case " << i << ": " << jt::FirstDiff(want, *got)
                    << "\nmessages: " << in.messages.dump().substr(0, 2000);
      ++failures;
    }
    if (failures >= 5) break;  // enough to debug; keep the log readable
  }
  EXPECT_EQ(failures, 0);
  // The generator must keep exercising what it claims to.
  EXPECT_GT(with_tools, 50);
  if (model != "gemma3") {
    EXPECT_GT(tool_calls, 30);
  }
  std::cout << model << ": " << cases.size() << " conversations (" << errors_expected
            << " expected errors, " << with_tools << " with tools)\n";
}

INSTANTIATE_TEST_SUITE_P(Models, ChatTemplateReferenceTest,
                         ::testing::Values("qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss"));

std::string ReadAll(FILE* f) {
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return out;
}

class TempDir;

// `agentkv template` prints exactly what Python renders, without a newline.
TEST(ChatTemplateCliTest, PrintsPromptExactly) {
  const std::string data = AGENTKV_DATA_DIR;
  if (!std::filesystem::exists(data + "/tokenizers/qwen3/tokenizer_config.json"))
    GTEST_SKIP() << "tokenizers missing; run scripts/setup.sh";
  if (!jt::HaveReferenceJinja()) GTEST_SKIP() << "python3-jinja2 is not installed";
  std::string out =
      jt::RunPython(std::string(AGENTKV_SOURCE_DIR) + "/tests/reference/jinja/gen_chat_cases.py " +
                    data + " --seed 77 --count 12 --models qwen3");
  ASSERT_FALSE(out.empty());
  auto cases = nlohmann::ordered_json::parse(out)["cases"];
  int checked = 0;
  const std::string tmp = std::filesystem::temp_directory_path() /
                          ("agentkv_template_cli_" + std::to_string(::getpid()));
  for (const auto& c : cases) {
    if (!c.contains("output") || c["tools"].is_null() || c["extra"].size() != 0) continue;
    std::ofstream(tmp + ".messages.json") << c["messages"].dump();
    std::ofstream(tmp + ".tools.json") << c["tools"].dump();
    std::string cmd = std::string(AGENTKV_BINARY) + " template --model " + data +
                      "/tokenizers/qwen3 --messages-file " + tmp + ".messages.json --tools-file " +
                      tmp + ".tools.json" +
                      (c["add_generation_prompt"].get<bool>() ? "" : " --no-generation-prompt");
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string got = ReadAll(p);
    EXPECT_EQ(pclose(p), 0) << cmd;
    const std::string want = c["output"];
    EXPECT_EQ(got, want) << jt::FirstDiff(want, got);
    ++checked;
  }
  std::filesystem::remove(tmp + ".messages.json");
  std::filesystem::remove(tmp + ".tools.json");
  EXPECT_GT(checked, 0);
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("agentkv_chat_template_" + std::to_string(::getpid()) + "_" + std::to_string(n_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(path_ / name) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int n_ = 0;
  std::filesystem::path path_;
};

TEST(ChatTemplateTest, NamedTemplatesPickDefaultOrToolUse) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({"bos_token": "<s>", "chat_template": [
      {"name": "default", "template": "D{{ bos_token }}{{ messages|length }}"},
      {"name": "tool_use", "template": "T{{ tools|length }}"}]})");
  auto t = ChatTemplate::LoadFromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatTemplate::Input in;
  in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(*t->Render(in), "D<s>1");
  in.tools = nlohmann::ordered_json::array({nlohmann::ordered_json::object()});
  EXPECT_EQ(*t->Render(in), "T1");
}

TEST(ChatTemplateTest, JinjaFileWinsOverConfig) {
  TempDir dir;
  dir.Write("tokenizer_config.json",
            R"({"eos_token": {"content": "</s>", "lstrip": false}, "chat_template": "config"})");
  dir.Write("chat_template.jinja", "file{{ eos_token }}\n");
  auto t = ChatTemplate::LoadFromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t->Render({}), "file</s>");  // jinja2 drops the single trailing newline
}

TEST(ChatTemplateTest, MissingTemplateIsNotFound) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto t = ChatTemplate::LoadFromModelDir(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
}

// agentkv's harmony template (GPT-OSS): the layout the model was trained on.
Result<ChatTemplate> HarmonyTemplate() {
  std::ifstream in(std::string(AGENTKV_SOURCE_DIR) + "/data/chat_templates/harmony.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  return ChatTemplate::FromSource(ss.str(), {{"eos_token", "<|return|>"}});
}

nlohmann::ordered_json HarmonyConversation() {
  return nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Old thought.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "And Rome?"},
    {"role": "assistant", "content": null, "reasoning_content": "Call again.",
     "tool_calls": [{"function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
    {"role": "tool", "content": {"sky": "clear"}}
  ])");
}

TEST(ChatTemplateTest, HarmonyTemplateWritesChannelsAndToolCalls) {
  auto t = HarmonyTemplate();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatTemplate::Input in;
  in.messages = HarmonyConversation();
  in.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Weather now.",
      "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "A city"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}}}}}])");
  in.extra = {{"reasoning_effort", "high"}};
  auto got = t->Render(in, FixedClock());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const std::string& p = *got;
  auto has = [&](std::string_view s) { return p.find(s) != std::string::npos; };
  EXPECT_TRUE(p.starts_with("<|start|>system<|message|>")) << p;
  EXPECT_TRUE(has("Current date: 2024-07-26\n\nReasoning: high\n\n")) << p;
  EXPECT_TRUE(has("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools")) << p;
  EXPECT_TRUE(
      has("namespace functions {\n\n// Weather now.\ntype get_weather = (_: {\n// A city\n"
          "city: string,\nunit?: \"c\" | \"f\", // default: \"c\"\n}) => any;\n\n"
          "} // namespace functions<|end|>"))
      << p;
  EXPECT_TRUE(
      has("<|start|>assistant to=functions.get_weather<|channel|>commentary json"
          "<|message|>{\"city\": \"Paris\"}<|call|>"
          "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
          "sunny<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|end|>"))
      << p;
  // Reasoning survives only in the turn in progress.
  EXPECT_FALSE(has("Old thought.")) << p;
  EXPECT_TRUE(
      has("<|start|>assistant<|channel|>analysis<|message|>Call again.<|end|>"
          "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
          "<|message|>{\"city\":\"Rome\"}<|call|><|start|>functions.get_weather "
          "to=assistant<|channel|>commentary<|message|>{\"sky\": \"clear\"}<|end|>"))
      << p;
  EXPECT_TRUE(p.ends_with("<|end|><|start|>assistant")) << p;
  in.add_generation_prompt = false;
  EXPECT_TRUE(t->Render(in, FixedClock())->ends_with("<|end|>"));
}

TEST(ChatTemplateTest, HarmonyTemplateRejectsWhatItCannotWrite) {
  auto t = HarmonyTemplate();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto error_of = [&](nlohmann::ordered_json messages, nlohmann::ordered_json extra) {
    ChatTemplate::Input in;
    in.messages = std::move(messages);
    in.extra = std::move(extra);
    auto r = t->Render(in, FixedClock());
    EXPECT_FALSE(r.ok());
    if (r.ok()) return std::string();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  const auto user = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  auto has = [](const std::string& s, std::string_view what) {
    return s.find(what) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of(user, {{"reasoning_effort", "extreme"}}), "reasoning_effort"));
  EXPECT_TRUE(has(error_of(user, {{"builtin_tools", {"calculator"}}}), "calculator"));
  EXPECT_TRUE(has(error_of(nlohmann::ordered_json::parse(R"([{"role": "critic", "content": "x"}])"),
                           nlohmann::ordered_json::object()),
                  "unknown role: critic"));
  EXPECT_TRUE(has(error_of(nlohmann::ordered_json::parse(R"([{"role": "tool", "content": "x"}])"),
                           nlohmann::ordered_json::object()),
                  "tool result"));
  // The defaults: medium effort, agentkv's identity, no built-in tools.
  ChatTemplate::Input in;
  in.messages = user;
  auto ok = t->Render(in, FixedClock());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(has(*ok, "Reasoning: medium")) << *ok;
  EXPECT_FALSE(has(*ok, "# Tools")) << *ok;
  in.extra = {{"builtin_tools", {"python"}}, {"model_identity", "You are Z."}};
  ok = t->Render(in, FixedClock());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->starts_with("<|start|>system<|message|>You are Z.\n")) << *ok;
  EXPECT_TRUE(has(*ok, "# Tools\n\n## python\n\n")) << *ok;
}

TEST(ChatTemplateTest, BrokenTemplateReportsLine) {
  auto t = ChatTemplate::FromSource("ok\n{% for m in messages %}\n{{ m.content }", {});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 3"), std::string::npos) << t.status().ToString();
}

}  // namespace
}  // namespace agentkv::text::chat
