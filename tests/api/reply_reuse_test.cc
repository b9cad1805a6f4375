// The agent's own reply is reused (AgentBinding::ReuseReply through the
// OpenAI, Anthropic and agents adapters), end to end on the CPU backend with
// a tiny Qwen3 model synthesized like the default one (real Qwen3 tokenizer
// and chat template, random weights): turn 2 of an agent sends back the
// reply the server generated, and the prefix cache serves the first prompt
// AND the reply (every full block the engine computed), at temperature 0
// and 1. With Anthropic's default (thinking off) Qwen3's template renders
// the earlier reply without the empty <think> block the first prompt ended
// with, so reuse stops where the texts diverge.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include <gtest/gtest.h>

#include "api/agent_binding.h"
#include "api/api_service.h"
#include "engine/model/model_synth.h"
#include "store/agent_store.h"

#include "drive_reply.h"

namespace agentkv::api {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ReplyReuseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("agentkv_reply_reuse_" + std::to_string(::getpid())));
    model::SynthOptions so;
    so.arch = "qwen3";
    so.tokenizer_dir = fs::path(AGENTKV_DATA_DIR) / "tokenizers/qwen3";
    so.out_dir = *dir_;
    so.layers = 2;
    so.hidden = 64;
    so.heads = 4;
    so.kv_heads = 2;
    so.head_dim = 16;
    so.intermediate = 128;
    so.max_position = 4096;
    so.seed = 1;
    Status s = model::SynthesizeModel(so);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  void SetUp() override { Serve(nullptr); }
  void TearDown() override { Stop(); }

  // A server on the tiny model, with `store` (may be null).
  void Serve(store::AgentStore* store) {
    ServedModelOptions o;
    o.model_dir = dir_->string();
    o.backend.threads = 1;
    o.max_batch = 4;
    o.store = store;
    auto m = ServedModel::Load(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    host_ = std::make_unique<ModelHost>(o, std::move(m).value());
    agents_ = std::make_unique<agent::AgentManager>(store);
    service_ = std::make_unique<ApiService>(ApiContext{host_.get(), agents_.get(), &metrics_},
                                            ApiServiceOptions{});
  }
  void Stop() {
    service_.reset();
    if (host_) {
      EXPECT_TRUE(host_->Shutdown().ok());
    }
    host_.reset();
    agents_.reset();
  }

  json Call(const std::string& path, const json& body) {
    HttpRequest r;
    r.method = "POST";
    r.headers["content-type"] = "application/json";
    r.path = path;
    r.body = body.dump();
    Reply reply = service_->Handle(r);
    if (auto* resp = std::get_if<HttpResponse>(&reply)) {
      ADD_FAILURE() << path << " -> " << resp->status << " " << resp->body;
      return json();
    }
    auto [status, out] = testing::DriveReply(std::move(reply));
    EXPECT_EQ(status, 200) << out;
    return json::parse(out, nullptr, false);
  }

  const ServedModel& model() const { return *host_->Current(); }
  int block() const { return model().engine().block_size(); }
  std::vector<int32_t> Remembered(const std::string& agent) const {
    return agents_->identifier().Remembered(agent);
  }
  std::string Bytes(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) out += model().tokenizer().TokenBytes(id).value_or("\x01?\x01");
    return out;
  }
  // The ids of the agent's last reply, checked to be exactly the text the
  // client got (the premise of reusing it): its last remembered tokens
  // after the `prompt_tokens` of its prompt.
  std::vector<int32_t> ReplyIds(const std::string& agent, int64_t prompt_tokens,
                                const std::string& text) const {
    const std::vector<int32_t> all = Remembered(agent);
    EXPECT_GE(all.size(), static_cast<size_t>(prompt_tokens));
    std::vector<int32_t> reply(all.begin() + prompt_tokens, all.end());
    EXPECT_EQ(Bytes(reply), text) << "the random reply does not round-trip; pick another seed";
    return reply;
  }
  // Whether the normal tokenization of turn 2's prompt (OpenAI-shape
  // `messages` rendered with `extra`) shares fewer full blocks with what the
  // agent holds than `full_blocks`: else the test would pass without reuse.
  bool NormalTokenizationFallsShort(const std::string& agent, const json& messages,
                                    const json& extra, int64_t full_blocks) const {
    const std::vector<int32_t> held = Remembered(agent);
    auto normal = model().EncodeChat(nlohmann::ordered_json::parse(messages.dump()), nullptr,
                                     nlohmann::ordered_json::parse(extra.dump()));
    EXPECT_TRUE(normal.ok());
    if (!normal.ok()) return false;
    const size_t n = std::min(held.size(), normal->size());
    const int64_t same =
        std::mismatch(held.begin(), held.begin() + n, normal->begin()).first - held.begin();
    return same / block() * block() < full_blocks;
  }
  // Every full block of what turn 1 computed: its prompt and reply, less
  // the last sampled token, which was never fed back.
  int64_t FullBlocksOf(int64_t prompt, int64_t completion) const {
    return (prompt + completion - 1) / block() * block();
  }

  static fs::path* dir_;
  std::unique_ptr<ModelHost> host_;
  std::unique_ptr<agent::AgentManager> agents_;
  Metrics metrics_;
  std::unique_ptr<ApiService> service_;
};

fs::path* ReplyReuseTest::dir_ = nullptr;

class ReplyReuseTemperatureTest : public ReplyReuseTest,
                                  public ::testing::WithParamInterface<float> {};

TEST_P(ReplyReuseTemperatureTest, OpenAiChatReusesPromptAndReply) {
  json msgs = json::array({{{"role", "system"}, {"content", "You are a terse assistant."}},
                           {{"role", "user"}, {"content", "Name three prime numbers."}}});
  json body = {{"messages", msgs},
               {"max_tokens", 40},
               {"temperature", GetParam()},
               {"seed", GetParam() == 0 ? 11 : 16},
               {"session_id", "oa"}};
  json r1 = Call("/v1/chat/completions", body);
  ASSERT_TRUE(r1.is_object());
  const int64_t p1 = r1["usage"]["prompt_tokens"], c1 = r1["usage"]["completion_tokens"];
  const std::string reply = r1["choices"][0]["message"]["content"];
  ASSERT_FALSE(r1["choices"][0]["message"].contains("reasoning_content"));
  const std::vector<int32_t> previous = Remembered("oa");
  const std::vector<int32_t> generated = ReplyIds("oa", p1, reply);
  ASSERT_EQ(static_cast<int64_t>(generated.size()), c1);
  ASSERT_GE(c1, 2 * block());  // the reply spans blocks worth reusing

  msgs.push_back({{"role", "assistant"}, {"content", reply}});
  msgs.push_back({{"role", "user"}, {"content", "And two more?"}});
  ASSERT_TRUE(NormalTokenizationFallsShort("oa", msgs, json::object(), FullBlocksOf(p1, c1)));
  body["messages"] = msgs;
  json r2 = Call("/v1/chat/completions", body);
  ASSERT_TRUE(r2.is_object());
  const int64_t cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, FullBlocksOf(p1, c1));
  // Turn 2's prompt began with every id the agent held.
  const std::vector<int32_t> now = Remembered("oa");
  ASSERT_GE(now.size(), previous.size());
  EXPECT_TRUE(std::equal(previous.begin(), previous.end(), now.begin()));
}

INSTANTIATE_TEST_SUITE_P(Temperatures, ReplyReuseTemperatureTest, ::testing::Values(0.f, 1.f));

TEST_F(ReplyReuseTest, AnthropicMessagesReusePromptAndReplyWithThinkingOn) {
  json msgs = json::array({{{"role", "user"}, {"content", "Describe a river in one line."}}});
  json body = {{"model", "m"},
               {"max_tokens", 40},
               {"temperature", 1},
               {"seed", 7},
               {"system", "You write short answers."},
               {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
               {"messages", msgs},
               {"metadata", {{"user_id", "user_1_account_2_session_an"}}}};
  json r1 = Call("/v1/messages", body);
  ASSERT_TRUE(r1.is_object());
  const int64_t p1 = r1["usage"]["input_tokens"], c1 = r1["usage"]["output_tokens"];
  ASSERT_EQ(r1["content"].size(), 1u) << r1.dump();
  ASSERT_EQ(r1["content"][0]["type"], "text");
  const std::string reply = r1["content"][0]["text"];
  ReplyIds("an", p1, reply);
  ASSERT_GE(c1, 2 * block());
  json openai_shape = json::array({{{"role", "system"}, {"content", "You write short answers."}},
                                   msgs[0],
                                   {{"role", "assistant"}, {"content", reply}},
                                   {{"role", "user"}, {"content", "Another one."}}});
  ASSERT_TRUE(NormalTokenizationFallsShort("an", openai_shape, {{"enable_thinking", true}},
                                           FullBlocksOf(p1, c1)));

  msgs.push_back({{"role", "assistant"}, {"content", json::array({r1["content"][0]})}});
  msgs.push_back({{"role", "user"}, {"content", "Another one."}});
  body["messages"] = msgs;
  json r2 = Call("/v1/messages", body);
  ASSERT_TRUE(r2.is_object());
  EXPECT_GE(r2["usage"]["cache_read_input_tokens"].get<int64_t>(), FullBlocksOf(p1, c1));
}

TEST_F(ReplyReuseTest, AnthropicThinkingOffStopsWhereTheTemplateDropsTheThinkBlock) {
  // Claude Code's default: thinking off, so the first prompt ends with an
  // empty <think></think> block that Qwen3's template leaves out when it
  // renders that reply as an earlier turn.
  json msgs = json::array({{{"role", "user"}, {"content", "Describe a mountain in one line."}}});
  json body = {{"model", "m"},     {"max_tokens", 40},
               {"temperature", 0}, {"system", "You write short answers."},
               {"messages", msgs}, {"metadata", {{"user_id", "user_1_account_2_session_cc"}}}};
  json r1 = Call("/v1/messages", body);
  ASSERT_TRUE(r1.is_object());
  const int64_t p1 = r1["usage"]["input_tokens"], c1 = r1["usage"]["output_tokens"];
  const std::string reply = r1["content"][0]["text"];
  ReplyIds("cc", p1, reply);
  ASSERT_GE(c1, 2 * block());
  const std::vector<int32_t> previous = Remembered("cc");

  msgs.push_back({{"role", "assistant"}, {"content", reply}});
  msgs.push_back({{"role", "user"}, {"content", "Another one."}});
  body["messages"] = msgs;
  json r2 = Call("/v1/messages", body);
  ASSERT_TRUE(r2.is_object());
  // Shared: the first prompt up to "<|im_start|>assistant\n", not the empty
  // think block after it, nor the reply rendered after a different context.
  const int64_t think =
      static_cast<int64_t>(model().tokenizer().Encode("<think>\n\n</think>\n\n", false).size());
  EXPECT_EQ(r2["usage"]["cache_read_input_tokens"].get<int64_t>(),
            (p1 - think) / block() * block());
  // Turn 2's prompt held the agent's ids up to there, and other ids after.
  const std::vector<int32_t> now = Remembered("cc");
  ASSERT_GT(now.size(), static_cast<size_t>(p1));
  EXPECT_TRUE(std::equal(previous.begin(), previous.begin() + (p1 - think), now.begin()));
  EXPECT_NE(previous[p1 - think], now[p1 - think]);
}

TEST_F(ReplyReuseTest, AgentsApiReusesPromptAndReply) {
  json r1 = Call("/v1/agents/ag/generate", {{"message", "List some colours."},
                                            {"system", "Be brief."},
                                            {"max_tokens", 40},
                                            {"temperature", 1},
                                            {"seed", 5}});
  ASSERT_TRUE(r1.is_object());
  const int64_t p1 = r1["usage"]["prompt_tokens"], c1 = r1["usage"]["completion_tokens"];
  ReplyIds("ag", p1, r1["text"]);
  ASSERT_GE(c1, 2 * block());
  json openai_shape = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", "List some colours."}},
                                   {{"role", "assistant"}, {"content", r1["text"]}},
                                   {{"role", "user"}, {"content", "More."}}});
  ASSERT_TRUE(
      NormalTokenizationFallsShort("ag", openai_shape, json::object(), FullBlocksOf(p1, c1)));
  json r2 = Call("/v1/agents/ag/generate", {{"message", "More."}, {"max_tokens", 4}});
  ASSERT_TRUE(r2.is_object());
  EXPECT_GE(r2["usage"]["cached_tokens"].get<int64_t>(), FullBlocksOf(p1, c1));
}

TEST_F(ReplyReuseTest, AfterARestartTheStoredChainIsReused) {
  // Turn 1 with a store; the server restarts; content matching and reply
  // reuse then know only the agent's stored chain (full blocks), a prefix of
  // the ids it held, and turn 2 restores that prefix from disk.
  Stop();
  const fs::path store_dir =
      fs::temp_directory_path() / ("agentkv_reply_reuse_store_" + std::to_string(::getpid()));
  fs::remove_all(store_dir);
  store::StoreOptions so;
  so.sync = false;
  auto st = store::AgentStore::Open(store_dir.string(), so);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  std::unique_ptr<store::AgentStore> store = std::move(st).value();
  Serve(store.get());
  json r1 = Call("/v1/agents/rs/generate", {{"message", "List some colours."},
                                            {"system", "Be brief."},
                                            {"max_tokens", 40},
                                            {"temperature", 1},
                                            {"seed", 5}});
  ASSERT_TRUE(r1.is_object());
  const int64_t p1 = r1["usage"]["prompt_tokens"], c1 = r1["usage"]["completion_tokens"];
  ReplyIds("rs", p1, r1["text"]);
  const std::vector<int32_t> held = Remembered("rs");
  Stop();

  Serve(store.get());
  auto n = AgentBinding::RememberStoredAgents(model(), *agents_);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1u);
  const std::vector<int32_t> chain = Remembered("rs");
  ASSERT_EQ(static_cast<int64_t>(chain.size()), FullBlocksOf(p1, c1));
  ASSERT_LT(chain.size(), held.size());
  EXPECT_TRUE(std::equal(chain.begin(), chain.end(), held.begin()));
  json openai_shape = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", "List some colours."}},
                                   {{"role", "assistant"}, {"content", r1["text"]}},
                                   {{"role", "user"}, {"content", "More."}}});
  ASSERT_TRUE(
      NormalTokenizationFallsShort("rs", openai_shape, json::object(), FullBlocksOf(p1, c1)));
  json r2 = Call("/v1/agents/rs/generate", {{"message", "More."}, {"max_tokens", 4}});
  ASSERT_TRUE(r2.is_object());
  EXPECT_EQ(r2["turn"], 2);
  EXPECT_EQ(r2["usage"]["cached_tokens"].get<int64_t>(), FullBlocksOf(p1, c1));
  EXPECT_EQ(r2["usage"]["cache_source"], "disk");
  Stop();
  store.reset();
  fs::remove_all(store_dir);
}

}  // namespace
}  // namespace agentkv::api
