// End-to-end on GPT-OSS: `agentkv model synth --arch gpt_oss --quant mxfp4`
// with the GPT-OSS tokenizer and its harmony template writes a tiny model;
// `agentkv serve` runs it on the CPU; the official OpenAI and Anthropic npm
// clients (tests/api/harmony.cjs) send a chat with tools and /v1/messages.
// The prompt token count the server reports must be that of the harmony
// rendering (`agentkv template` then `agentkv tokenize`). Skipped when the
// GPT-OSS tokenizer is missing, and (that test) node or the npm packages.
// Constrained decoding in the harmony format: strict tools, forced tool
// choices and response_format at temperature 1, every call and structured
// answer validated by python3-jsonschema (tests/api/harmony_tools.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "serve_process.h"

namespace {

namespace fs = std::filesystem;

using agentkv::testing::RunShell;
using agentkv::testing::ServeProcess;

class GptOssServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    npm_ = fs::path(AGENTKV_SOURCE_DIR) / "tools/npm";
    tokenizer_ = fs::path(AGENTKV_DATA_DIR) / "tokenizers/gptoss";
    if (!fs::exists(tokenizer_ / "tokenizer.json") ||
        !fs::exists(tokenizer_ / "chat_template.jinja"))
      GTEST_SKIP() << "gptoss tokenizer or its template not set up (scripts/setup.sh)";
    char tmpl[] = "/tmp/agentkv-gptoss-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    server_.Kill();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Starts `agentkv serve` on `model`; the port, or -1.
  int Serve(const fs::path& model) {
    return server_.StartListening({"--model", model.string(), "--port", "0", "--threads", "2",
                                   "--store", (dir_ / "store").string()});
  }

  fs::path npm_, tokenizer_, dir_;
  ServeProcess server_;
};

TEST_F(GptOssServerTest, ChatWithToolsAndMessagesThroughTheOfficialClients) {
  {
    int st = 0;
    RunShell("node --version > /dev/null 2>&1", &st);
    if (st != 0) GTEST_SKIP() << "node is not installed";
    if (!fs::exists(npm_ / "node_modules/openai") ||
        !fs::exists(npm_ / "node_modules/@anthropic-ai/sdk"))
      GTEST_SKIP() << "npm packages missing";
  }
  const fs::path model = dir_ / "model";
  const std::string bin = AGENTKV_BINARY;
  int st = 0;
  // No eos bias: greedy replies of random weights run to max_tokens, so
  // every reply's usage is exactly known.
  std::string out = RunShell(bin + " model synth --arch gpt_oss --quant mxfp4 --tokenizer '" +
                                 tokenizer_.string() + "' --out '" + model.string() +
                                 "' --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16"
                                 " --intermediate 64 --experts 4 --experts-per-token 2"
                                 " --seed 3 2>&1",
                             &st);
  ASSERT_EQ(st, 0) << out;
  ASSERT_TRUE(fs::exists(model / "chat_template.jinja"));

  // A conversation with a system prompt and one tool; schema keys sorted,
  // so the Anthropic form (converted by the server) renders identically.
  const std::string request = (dir_ / "request.json").string();
  {
    std::ofstream f(request);
    f << R"({"messages": [
  {"role": "system", "content": "You answer weather questions."},
  {"role": "user", "content": "What is the weather in Paris?"}],
 "tools": [{"type": "function", "function": {"name": "get_weather",
   "description": "Current weather for a city",
   "parameters": {"properties": {"city": {"description": "City name", "type": "string"}},
                  "required": ["city"], "type": "object"}}}]})";
  }
  const std::string rendered = (dir_ / "prompt.txt").string();
  out = RunShell(bin + " template --model '" + model.string() + "' --messages-file '" + request +
                     "' > '" + rendered + "' 2>&1",
                 &st);
  ASSERT_EQ(st, 0) << out;
  std::string prompt;
  {
    std::ifstream f(rendered, std::ios::binary);
    prompt.assign(std::istreambuf_iterator<char>(f), {});
  }
  // The harmony rendering: developer message with the tool namespace, the
  // user turn, and the generation prompt.
  EXPECT_NE(prompt.find("<|start|>developer<|message|>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("namespace functions"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("type get_weather"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|start|>user<|message|>What is the weather in Paris?<|end|>"),
            std::string::npos)
      << prompt;
  ASSERT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;
  const std::string ids =
      RunShell(bin + " tokenize --model '" + model.string() + "' --file '" + rendered + "'", &st);
  ASSERT_EQ(st, 0) << ids;
  const size_t prompt_tokens = std::count(ids.begin(), ids.end(), ',') + 1;
  ASSERT_GT(prompt_tokens, 20u) << ids;

  const int port = Serve(model);
  ASSERT_GT(port, 0);
  const std::string script = std::string(AGENTKV_SOURCE_DIR) + "/tests/api/harmony.cjs";
  out = RunShell("timeout 60 node '" + script + "' " + std::to_string(port) + " '" + npm_.string() +
                     "' " + std::to_string(prompt_tokens) + " '" + request + "' 2>&1",
                 &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("ALL OK"), std::string::npos) << out;
  std::printf("prompt: %zu tokens\n%s", prompt_tokens, out.c_str());
  EXPECT_TRUE(server_.Stop());
}

TEST_F(GptOssServerTest, ConstrainedToolCallsAndAnswersValidate) {
  int st = 0;
  RunShell("python3 -c 'import jsonschema' > /dev/null 2>&1", &st);
  if (st != 0) GTEST_SKIP() << "python3-jsonschema is not installed";
  const fs::path model = dir_ / "model";
  const std::string bin = AGENTKV_BINARY;
  std::string out = RunShell(bin + " model synth --arch gpt_oss --quant mxfp4 --tokenizer '" +
                                 tokenizer_.string() + "' --out '" + model.string() +
                                 "' --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16"
                                 " --intermediate 64 --experts 4 --experts-per-token 2"
                                 " --seed 5 2>&1",
                             &st);
  ASSERT_EQ(st, 0) << out;
  const int port = Serve(model);
  ASSERT_GT(port, 0);
  out = RunShell("timeout 300 python3 '" + std::string(AGENTKV_SOURCE_DIR) +
                     "/tests/api/harmony_tools.py' " + std::to_string(port) + " 2>&1",
                 &st);
  EXPECT_EQ(st, 0) << out;
  std::printf("%s", out.c_str());
  EXPECT_TRUE(server_.Stop());
}

}  // namespace
