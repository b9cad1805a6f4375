// AgentsApi through ApiService on the default model and a real store:
// generate keeps the history server-side (turn numbers, the second turn
// reuses the first's KV), the reply and SSE shapes of SPEC section 7, get
// and list, delete (history and KV), and bad input as OpenAI-shaped 4xx.
#include "api/agents_api.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include "api/api_service.h"
#include "engine/model/model_synth.h"
#include "util/task_pool.h"

#include "drive_reply.h"

namespace agentkv::api {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class AgentsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path dir = fs::path(AGENTKV_DATA_DIR) / "models/default";
    if (!fs::exists(dir / "config.json")) GTEST_SKIP() << "default model missing";
    MakeTmp();
    ServedModelOptions o;
    o.model_dir = dir.string();
    Start(o);
  }
  void MakeTmp() {
    std::string tmpl = (fs::temp_directory_path() / "agentkv_agents_api_XXXXXX").string();
    tmp_ = ::mkdtemp(tmpl.data());
  }
  void Start(ServedModelOptions o) {
    store::StoreOptions so;
    so.sync = false;
    auto st = store::AgentStore::Open(tmp_, so);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    store_ = std::move(st).value();
    o.backend.threads = 1;
    o.store = store_.get();
    auto m = ServedModel::Load(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    host_ = std::make_unique<ModelHost>(o, std::move(m).value());
    agents_ = std::make_unique<agent::AgentManager>(store_.get());
    service_ = std::make_unique<ApiService>(ApiContext{host_.get(), agents_.get(), &metrics_},
                                            ApiServiceOptions{});
  }
  void TearDown() override {
    service_.reset();
    if (host_) (void)host_->Shutdown();
    host_.reset();
    agents_.reset();
    store_.reset();
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }

  std::pair<int, std::string> Call(const std::string& method, const std::string& path,
                                   const std::string& body = "",
                                   const std::map<std::string, std::string>& headers = {}) {
    HttpRequest r;
    r.headers = headers;
    r.method = method;
    r.path = path.substr(0, path.find('?'));
    if (path.find('?') != std::string::npos) r.query = path.substr(path.find('?') + 1);
    r.body = body;
    if (method == "POST") r.headers["content-type"] = "application/json";
    Reply reply = service_->Handle(r);
    return testing::DriveReply(std::move(reply));
  }

  std::string tmp_;
  std::unique_ptr<store::AgentStore> store_;
  std::unique_ptr<ModelHost> host_;
  std::unique_ptr<agent::AgentManager> agents_;
  Metrics metrics_;
  std::unique_ptr<ApiService> service_;
};

TEST_F(AgentsApiTest, GenerateKeepsHistoryAndCache) {
  auto [st, body] = Call(
      "POST", "/v1/agents/a1/generate",
      R"({"message":"Hello there, agent.","system":"Be brief.","max_tokens":4,"temperature":0})");
  ASSERT_EQ(st, 200) << body;
  json r1 = json::parse(body);
  EXPECT_EQ(r1["agent_id"], "a1");
  EXPECT_EQ(r1["turn"], 1);
  EXPECT_TRUE(r1["text"].is_string());
  EXPECT_TRUE(r1["finish_reason"] == "length" || r1["finish_reason"] == "stop");
  EXPECT_EQ(r1["usage"]["cache_source"], "none");
  EXPECT_EQ(r1["usage"]["cached_tokens"], 0);
  for (const char* k : {"prompt_tokens", "completion_tokens", "cached_tokens"}) {
    EXPECT_TRUE(r1["usage"][k].is_number_integer()) << k;
  }

  std::tie(st, body) = Call("POST", "/v1/agents/a1/generate",
                            R"({"message":"And again?","max_tokens":3,"stream":true})");
  ASSERT_EQ(st, 200) << body;
  // SSE: {"text"} events, then one with the reply's fields.
  std::vector<json> events;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    events.push_back(json::parse(body.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  ASSERT_GE(events.size(), 1u);
  const json last = events.back();
  EXPECT_EQ(last["turn"], 2);
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) streamed += events[i]["text"].get<std::string>();
  EXPECT_EQ(streamed, last["text"]);
  EXPECT_GT(last["usage"]["prompt_tokens"].get<int>(), r1["usage"]["prompt_tokens"].get<int>());
  EXPECT_GT(last["usage"]["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(last["usage"]["cache_source"], "resident");

  std::tie(st, body) = Call("GET", "/v1/agents/a1");
  ASSERT_EQ(st, 200) << body;
  json g = json::parse(body);
  EXPECT_EQ(g["turns"], 2);
  ASSERT_EQ(g["history"].size(), 2u);
  EXPECT_EQ(g["history"][0]["messages"][0], json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(g["history"][1]["messages"][0]["content"], "And again?");
  EXPECT_EQ(g["history"][1]["messages"][1]["content"], last["text"]);
  EXPECT_EQ(g["cache"]["location"], "resident");
  EXPECT_GT(g["cache"]["resident_tokens"].get<int>(), 0);

  std::tie(st, body) = Call("GET", "/v1/agents");
  EXPECT_EQ(json::parse(body)["data"].size(), 1u);
  std::tie(st, body) = Call("DELETE", "/v1/agents/a1");
  EXPECT_EQ(st, 200) << body;
  EXPECT_EQ(Call("GET", "/v1/agents/a1").first, 404);
  EXPECT_EQ(Call("DELETE", "/v1/agents/a1").first, 404);
  auto hist = store_->GetHistory("a1");
  EXPECT_TRUE(!hist.ok() || hist->empty());
  // A new conversation under the same id starts again at turn 1, with
  // nothing of the deleted agent's history in its prompt.
  std::tie(st, body) = Call("POST", "/v1/agents/a1/generate", R"({"message":"Hi","max_tokens":1})");
  EXPECT_EQ(json::parse(body)["turn"], 1);
}

TEST_F(AgentsApiTest, TurnsRecordAndDeleteOnTheWorkerPool) {
  // As `serve` runs it: agents' tasks start on the pool and finished turns
  // are recorded there, never on the thread that polls the reply.
  TaskPool pool(2, "workers");
  agent::AgentManagerOptions ao;
  ao.executor = [&pool](std::function<void()> f) { pool.Post(std::move(f)); };
  agents_ = std::make_unique<agent::AgentManager>(store_.get(), ao);
  service_ = std::make_unique<ApiService>(ApiContext{host_.get(), agents_.get(), &metrics_, &pool},
                                          ApiServiceOptions{});
  auto [st, body] = Call("POST", "/v1/agents/w1/generate", R"({"message":"Hello","max_tokens":2})");
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["turn"], 1);
  std::tie(st, body) =
      Call("POST", "/v1/agents/w1/generate", R"({"message":"Again","max_tokens":2,"stream":true})");
  ASSERT_EQ(st, 200) << body;
  EXPECT_NE(body.find("\"turn\":2"), std::string::npos) << body;
  auto hist = store_->GetHistory("w1");
  ASSERT_TRUE(hist.ok());
  EXPECT_EQ(hist->size(), 2u);
  std::tie(st, body) = Call("DELETE", "/v1/agents/w1");
  EXPECT_EQ(st, 200) << body;
  EXPECT_EQ(Call("GET", "/v1/agents/w1").first, 404);
  service_.reset();
  pool.Stop();
  agents_.reset();  // its executor is the pool's
}

TEST_F(AgentsApiTest, TenantsSeeOnlyTheirOwnAgents) {
  ApiServiceOptions so;
  auto keys = TenantKeys::Parse("acme-key-0123456789 acme\nzeta-key-0123456789 zeta\n");
  ASSERT_TRUE(keys.ok());
  so.tenants = *keys;
  service_ = std::make_unique<ApiService>(ApiContext{host_.get(), agents_.get(), &metrics_}, so);
  const std::map<std::string, std::string> acme = {{"x-api-key", "acme-key-0123456789"}};
  const std::map<std::string, std::string> zeta = {{"authorization", "Bearer zeta-key-0123456789"}};
  // No key, or one not in the file: 401.
  EXPECT_EQ(Call("GET", "/v1/agents").first, 401);
  EXPECT_EQ(Call("GET", "/v1/agents", "", {{"x-api-key", "acme"}}).first, 401);

  auto [st, body] =
      Call("POST", "/v1/agents/x/generate", R"({"message":"Hi","max_tokens":1})", acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["agent_id"], "x");        // as the tenant knows it
  EXPECT_TRUE(store_->GetAgent("acme/x").ok());         // stored in its scope
  ASSERT_TRUE(store_->AppendTurn("other", "[]").ok());  // an untenanted agent

  json page = json::parse(Call("GET", "/v1/agents", "", acme).second);
  ASSERT_EQ(page["data"].size(), 1u);
  EXPECT_EQ(page["data"][0]["id"], "x");
  EXPECT_EQ(page["last_id"], "x");
  EXPECT_EQ(json::parse(Call("GET", "/v1/agents?after=x", "", acme).second)["data"].size(), 0u);
  // Zeta sees none of it: not in its list, not by id, cannot delete it.
  EXPECT_EQ(json::parse(Call("GET", "/v1/agents", "", zeta).second)["data"].size(), 0u);
  std::tie(st, body) = Call("GET", "/v1/agents/x", "", zeta);
  EXPECT_EQ(st, 404);
  EXPECT_EQ(body.find("zeta/"), std::string::npos) << body;  // scopes are never shown
  EXPECT_EQ(Call("DELETE", "/v1/agents/x", "", zeta).first, 404);
  EXPECT_EQ(Call("GET", "/v1/agents/acme%2Fx", "", zeta).first, 404);
  std::tie(st, body) = Call("GET", "/v1/agents/x", "", acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["id"], "x");
  EXPECT_EQ(json::parse(body)["history"].size(), 1u);
  // Zeta's own "x" is another agent.
  std::tie(st, body) =
      Call("POST", "/v1/agents/x/generate", R"({"message":"Yo","max_tokens":1})", zeta);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["turn"], 1);
  std::tie(st, body) = Call("DELETE", "/v1/agents/x", "", acme);
  EXPECT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["id"], "x");
  EXPECT_FALSE(store_->GetAgent("acme/x").ok());
  EXPECT_TRUE(store_->GetAgent("zeta/x").ok());
  // Reloaded keys: acme's old key is gone.
  auto reloaded = TenantKeys::Parse("acme-key-new-0123456789 acme\n");
  ASSERT_TRUE(reloaded.ok());
  service_->SetTenants(*reloaded);
  EXPECT_EQ(Call("GET", "/v1/agents", "", acme).first, 401);
  EXPECT_EQ(Call("GET", "/v1/agents", "", {{"x-api-key", "acme-key-new-0123456789"}}).first, 200);
}

// Tenants share no cached prompts: the same system prompt and message from
// another tenant finds nothing cached (cached_tokens would reveal the
// first tenant's prompt), over the agents API and OpenAI chat alike; the
// same tenant's other agents still reuse it. A body "cache_salt" salts
// further within a tenant.
TEST_F(AgentsApiTest, TenantsShareNoCachedPrompts) {
  ApiServiceOptions so;
  auto keys = TenantKeys::Parse("acme-key-0123456789 acme\nzeta-key-0123456789 zeta\n");
  ASSERT_TRUE(keys.ok());
  so.tenants = *keys;
  service_ = std::make_unique<ApiService>(ApiContext{host_.get(), agents_.get(), &metrics_}, so);
  const std::map<std::string, std::string> acme = {{"x-api-key", "acme-key-0123456789"}};
  const std::map<std::string, std::string> zeta = {{"x-api-key", "zeta-key-0123456789"}};
  const std::string system =
      "You are the build assistant of a large project. Answer in one short sentence, cite the "
      "file you looked at, and never guess at a command you have not seen run successfully.";
  const json req = {{"system", system},
                    {"message", "Which target builds the server binary?"},
                    {"max_tokens", 2},
                    {"temperature", 0}};
  auto cached = [](const std::string& body) {
    return json::parse(body)["usage"]["cached_tokens"].get<int>();
  };
  auto [st, body] = Call("POST", "/v1/agents/x/generate", req.dump(), acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(cached(body), 0);
  std::tie(st, body) = Call("POST", "/v1/agents/x/generate", req.dump(), zeta);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(cached(body), 0);
  EXPECT_EQ(json::parse(body)["usage"]["cache_source"], "none");
  // OpenAI chat: acme's conversation is cached for acme, not for zeta.
  const json chat = {{"messages",
                      {{{"role", "system"}, {"content", "Reply in French. " + system}},
                       {{"role", "user"}, {"content", "Which target builds the server binary?"}}}},
                     {"max_tokens", 2},
                     {"temperature", 0}};
  auto chat_cached = [](const std::string& body) {
    return json::parse(body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  std::tie(st, body) = Call("POST", "/v1/chat/completions", chat.dump(), acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(chat_cached(body), 0);
  std::tie(st, body) = Call("POST", "/v1/chat/completions", chat.dump(), zeta);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(chat_cached(body), 0);
  // Acme's other agent reuses acme's prompt.
  std::tie(st, body) = Call("POST", "/v1/agents/y/generate", req.dump(), acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_GT(cached(body), 0);
  // A body salt is another cache inside the tenant.
  json salted = req;
  salted["cache_salt"] = "user-17";
  std::tie(st, body) = Call("POST", "/v1/agents/z/generate", salted.dump(), acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(cached(body), 0);
  std::tie(st, body) = Call("POST", "/v1/agents/w/generate", salted.dump(), acme);
  ASSERT_EQ(st, 200) << body;
  EXPECT_GT(cached(body), 0);
  for (const json& bad : {json(17), json(""), json(std::string(2000, 's'))}) {
    salted["cache_salt"] = bad;
    std::tie(st, body) = Call("POST", "/v1/agents/v/generate", salted.dump(), acme);
    EXPECT_EQ(st, 400) << body;
    EXPECT_NE(body.find("cache_salt"), std::string::npos) << body;
  }
  // The other protocols refuse a bad salt the same way.
  json bad_chat = chat;
  bad_chat["cache_salt"] = json::array();
  std::tie(st, body) = Call("POST", "/v1/chat/completions", bad_chat.dump(), acme);
  EXPECT_EQ(st, 400) << body;
  EXPECT_NE(body.find("cache_salt"), std::string::npos) << body;
  const json bad_messages = {{"model", "m"},
                             {"max_tokens", 2},
                             {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                             {"cache_salt", 5}};
  std::tie(st, body) = Call("POST", "/v1/messages", bad_messages.dump(), acme);
  EXPECT_EQ(st, 400) << body;
  EXPECT_NE(body.find("cache_salt"), std::string::npos) << body;
}

TEST_F(AgentsApiTest, ListIsPaginatedWithLimitAndAfter) {
  for (const char* id : {"p1", "p2", "p3"}) ASSERT_TRUE(store_->AppendTurn(id, "[]").ok());
  auto [st, body] = Call("GET", "/v1/agents?limit=2");
  ASSERT_EQ(st, 200) << body;
  json page = json::parse(body);
  ASSERT_EQ(page["data"].size(), 2u);
  EXPECT_EQ(page["data"][0]["id"], "p1");
  EXPECT_EQ(page["has_more"], true);
  EXPECT_EQ(page["first_id"], "p1");
  EXPECT_EQ(page["last_id"], "p2");
  std::tie(st, body) = Call("GET", "/v1/agents?limit=2&after=p2");
  page = json::parse(body);
  ASSERT_EQ(page["data"].size(), 1u);
  EXPECT_EQ(page["data"][0]["id"], "p3");
  EXPECT_EQ(page["has_more"], false);
  // `after` is percent-decoded; without a limit the default page holds all.
  page = json::parse(Call("GET", "/v1/agents?after=p%31").second);
  ASSERT_EQ(page["data"].size(), 2u);
  EXPECT_EQ(page["data"][0]["id"], "p2");
  page = json::parse(Call("GET", "/v1/agents?after=p3").second);
  EXPECT_TRUE(page["data"].empty());
  EXPECT_TRUE(page["last_id"].is_null());
  for (const char* bad : {"limit=0", "limit=1001", "limit=abc", "limit=", "limit=1e3"}) {
    std::tie(st, body) = Call("GET", std::string("/v1/agents?") + bad);
    EXPECT_EQ(st, 400) << bad << " -> " << body;
    EXPECT_EQ(json::parse(body)["error"]["param"], "limit") << bad;
  }
}

TEST_F(AgentsApiTest, BadInputIsOpenAiShaped400) {
  const char* bad[] = {"not json",
                       "[1]",
                       "{}",
                       R"({"message":1})",
                       R"({"message":""})",
                       R"({"message":"x","system":{}})",
                       R"({"message":"x","max_tokens":-2})",
                       R"({"message":"x","stream":1})",
                       R"({"message":"x","temperature":"warm"})",
                       R"({"message":"x","priority":"urgent"})"};
  for (const char* b : bad) {
    auto [st, body] = Call("POST", "/v1/agents/z/generate", b);
    EXPECT_EQ(st, 400) << b << " -> " << body;
    json j = json::parse(body);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << b;
  }
  EXPECT_EQ(
      Call("POST", "/v1/agents/" + std::string(257, 'a') + "/generate", R"({"message":"x"})").first,
      400);
  EXPECT_EQ(Call("GET", "/v1/agents/unknown").first, 404);
  // Path ids are percent-decoded: "my agent" is the same agent either way.
  auto [st, body] =
      Call("POST", "/v1/agents/my%20agent/generate", R"({"message":"x","max_tokens":1})");
  EXPECT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["agent_id"], "my agent");
  EXPECT_EQ(Call("GET", "/v1/agents/my%20agent").first, 200);
  EXPECT_EQ(Call("DELETE", "/v1/agents/my%20agent").first, 200);
  EXPECT_EQ(Call("PUT", "/v1/agents/z").first, 404);
  // Nothing was recorded for the failed requests.
  EXPECT_EQ(json::parse(Call("GET", "/v1/agents").second)["data"].size(), 0u);
}

// A small pool and a host-memory tier: an agent whose blocks the pool gave
// up to other agents' long turns resumes from host memory, and says so.
class AgentsApiHostTierTest : public AgentsApiTest {
 protected:
  void SetUp() override {
    MakeTmp();
    model::SynthOptions so;
    so.arch = "qwen3";
    so.tokenizer_dir = fs::path(AGENTKV_DATA_DIR) / "tokenizers/qwen3";
    so.out_dir = fs::path(tmp_) / "model";
    so.layers = 1;
    so.hidden = 32;
    so.heads = 2;
    so.kv_heads = 1;
    so.seed = 5;
    ASSERT_TRUE(model::SynthesizeModel(so).ok());
    ServedModelOptions o;
    o.model_dir = so.out_dir.string();
    o.max_step_tokens = 256;
    // One layer, one KV head of 16: 2 KiB per 16-token block; 48 blocks.
    o.kv_memory_bytes = 48 * 2048;
    o.host_kv_memory_bytes = 8ull << 20;
    Start(o);
  }
};

TEST_F(AgentsApiHostTierTest, ReturningAgentWhosePoolBlocksWereEvictedResumesFromHost) {
  const std::string first =
      R"({"message":"Tell me about the sea and the ships upon it.","system":"You are a )"
      R"(sailor who answers in long sentences about the weather.","max_tokens":8,)"
      R"("temperature":0})";
  auto [st, body] = Call("POST", "/v1/agents/keeper/generate", first);
  ASSERT_EQ(st, 200) << body;
  EXPECT_EQ(json::parse(body)["usage"]["cache_source"], "none");
  // Other agents with long prompts fill the pool several times over.
  std::string words;
  for (int i = 0; i < 120; ++i) words += "word" + std::to_string(i) + " ";
  for (int a = 0; a < 4; ++a) {
    std::tie(st, body) = Call("POST", "/v1/agents/other" + std::to_string(a) + "/generate",
                              R"({"message":")" + std::to_string(a) + " " + words +
                                  R"(","max_tokens":2,"temperature":0})");
    ASSERT_EQ(st, 200) << body;
  }
  const engine::EngineStats before = host_->Current()->engine().Stats();
  EXPECT_GT(before.host_kv_blocks, 0);
  std::tie(st, body) = Call("POST", "/v1/agents/keeper/generate",
                            R"({"message":"And the wind?","max_tokens":4,"temperature":0})");
  ASSERT_EQ(st, 200) << body;
  const json r = json::parse(body);
  EXPECT_EQ(r["usage"]["cache_source"], "host") << body;
  EXPECT_GT(r["usage"]["cached_tokens"].get<int>(), 16);
  EXPECT_EQ(host_->Current()->engine().Stats().resumed_host, 1);
  EXPECT_EQ(agents_->resume_counts().host, 1);
  // GET /admin/status and /metrics report the tier and the resume.
  std::tie(st, body) = Call("GET", "/admin/status");
  ASSERT_EQ(st, 200) << body;
  const json hk = json::parse(body)["engine"]["host_kv"];
  EXPECT_EQ(hk["capacity_bytes"], 8 << 20);
  EXPECT_GT(hk["blocks"].get<int>(), 0);
  EXPECT_GT(hk["bytes"].get<int64_t>(), 0);
  EXPECT_GT(hk["hits"].get<int>(), 0);
  EXPECT_GT(hk["restored_tokens"].get<int>(), 0);
  std::tie(st, body) = Call("GET", "/metrics");
  ASSERT_EQ(st, 200) << body;
  EXPECT_NE(body.find("agentkv_resume_total{source=\"host\"} 1"), std::string::npos) << body;
  EXPECT_NE(body.find("agentkv_host_kv_bytes "), std::string::npos);
}

}  // namespace
}  // namespace agentkv::api
