// AdminApi through ApiService on the default model: /admin/status fields,
// /metrics after a generation, and POST /admin/model input checks (the
// swap itself: model_host_test and the e2e test).
#include "api/admin_api.h"

#include <unistd.h>

#include <fstream>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "api/api_service.h"
#include "drive_reply.h"

namespace agentkv::api {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::pair<int, std::string> Drive(Reply reply) { return testing::DriveReply(std::move(reply)); }

HttpRequest Req(const std::string& method, const std::string& path, const std::string& body = "") {
  HttpRequest r;
  r.method = method;
  r.path = path;
  r.body = body;
  if (method == "POST") r.headers["content-type"] = "application/json";
  return r;
}

// The default model served on one thread, or null when setup has not made it.
fs::path DefaultModelDir() { return fs::path(AGENTKV_DATA_DIR) / "models/default"; }
std::unique_ptr<ModelHost> DefaultHost() {
  if (!fs::exists(DefaultModelDir() / "config.json")) return nullptr;
  ServedModelOptions o;
  o.model_dir = DefaultModelDir().string();
  o.backend.threads = 1;
  auto m = ServedModel::Load(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  return std::make_unique<ModelHost>(o, std::move(m).value());
}

TEST(AdminApiTest, StatusMetricsAndSwapInput) {
  const fs::path dir = DefaultModelDir();
  std::unique_ptr<ModelHost> served = DefaultHost();
  if (!served) GTEST_SKIP() << "default model missing";
  ModelHost& host = *served;
  agent::AgentManager agents(nullptr);
  Metrics metrics;
  ApiService svc({&host, &agents, &metrics}, {});

  auto [st, body] = Drive(svc.Handle(
      Req("POST", "/v1/agents/s/generate", R"({"message":"hi","max_tokens":3,"temperature":0})")));
  ASSERT_EQ(st, 200) << body;

  std::tie(st, body) = Drive(svc.Handle(Req("GET", "/admin/status")));
  ASSERT_EQ(st, 200);
  json s = json::parse(body);
  EXPECT_EQ(s["model"]["name"], "default");
  EXPECT_EQ(s["model"]["fingerprint"].get<std::string>().size(), 32u);
  EXPECT_GE(s["engine"]["max_batch_size"].get<int>(), 1);
  EXPECT_EQ(s["engine"]["running"], 0);
  ASSERT_GE(s["pools"].size(), 1u);
  EXPECT_GT(s["pools"][0]["total"].get<int>(), 0);
  EXPECT_EQ(s["pools"][0]["in_use"], 0);
  EXPECT_EQ(s["agents"]["known"], 1);
  ASSERT_EQ(s["agents"]["resident"].size(), 1u);
  EXPECT_EQ(s["agents"]["resident"][0]["id"], "s");
  EXPECT_EQ(s["agents"]["resident_count"], 1);
  EXPECT_FALSE(s.contains("store"));  // no store
  // The engine's timing and restore counters are there (a CPU engine
  // never splits: no prefill cost was timed; no store: no disk rates).
  EXPECT_GE(s["engine"]["timing"]["steps"].get<int64_t>(), 1);
  EXPECT_EQ(s["engine"]["restore"]["split_restores"], 0);
  EXPECT_EQ(s["engine"]["restore"]["prefill_seconds_per_token"], 0.0);
  EXPECT_EQ(s["engine"]["restore"]["disk_latency_s"], 0.0);
  EXPECT_EQ(s["engine"]["restore"]["recomputed_restores"], 0);
  // Speculative decoding is off by default: its counters are there, at 0.
  EXPECT_EQ(s["engine"]["speculative"]["draft_tokens"], 0);
  EXPECT_EQ(s["engine"]["speculative"]["accepted_tokens"], 0);
  EXPECT_EQ(s["engine"]["speculative"]["draft_steps"], 0);

  std::tie(st, body) = Drive(svc.Handle(Req("GET", "/metrics")));
  ASSERT_EQ(st, 200);
  for (const char* want :
       {"agentkv_requests_total{endpoint=\"/v1/agents/{id}/generate\",status=\"200\"} 1",
        "agentkv_requests_total{endpoint=\"/admin/status\",status=\"200\"} 1",
        "agentkv_time_to_first_token_seconds_count 1", "agentkv_output_tokens_total 3",
        "agentkv_queue_length 0", "agentkv_running_requests 0", "agentkv_batch_size_max 1",
        "agentkv_kv_blocks{group=\"0\",state=\"total\"}", "agentkv_resume_total{source=\"disk\"} 0",
        "agentkv_prefix_cache_hit_rate"}) {
    EXPECT_NE(body.find(want), std::string::npos) << want << "\n" << body;
  }

  for (const char* bad : {"nope", "{}", R"({"model":3})", R"({"model":""})"}) {
    std::tie(st, body) = Drive(svc.Handle(Req("POST", "/admin/model", bad)));
    EXPECT_EQ(st, 400) << bad;
    EXPECT_EQ(json::parse(body)["error"]["type"], "invalid_request_error");
  }
  // Swaps are off without a models directory.
  std::tie(st, body) =
      Drive(svc.Handle(Req("POST", "/admin/model", R"({"model":"/no/such/model"})")));
  EXPECT_EQ(st, 403) << body;

  // With one: only what is under it loads; a broken checkpoint there is a
  // 400 that does not quote its files, and the old model serves again.
  const fs::path models = fs::temp_directory_path() / ("agentkv-admin-" + std::to_string(getpid()));
  fs::create_directories(models / "broken");
  { std::ofstream(models / "broken" / "config.json") << "{\"secret\": \"hunter2\""; }
  ApiServiceOptions so;
  so.models_dir = models.string();
  ApiService swapper({&host, &agents, &metrics}, so);
  std::tie(st, body) =
      Drive(swapper.Handle(Req("POST", "/admin/model", R"({"model":"/no/such/model"})")));
  EXPECT_EQ(st, 403) << body;
  std::tie(st, body) = Drive(swapper.Handle(
      Req("POST", "/admin/model", json{{"model", dir.string()}}.dump())));  // outside
  EXPECT_EQ(st, 403) << body;
  std::tie(st, body) = Drive(swapper.Handle(Req("POST", "/admin/model", R"({"model":"broken"})")));
  EXPECT_EQ(st, 400) << body;
  EXPECT_EQ(body.find("hunter2"), std::string::npos) << body;
  ASSERT_NE(host.Current(), nullptr);  // the old model serves again
  EXPECT_EQ(host.Current()->name(), "default");
  fs::remove_all(models);
  (void)host.Shutdown();
}

TEST(AdminApiTest, ModelDirsMustLieUnderTheModelsDir) {
  const fs::path root = fs::temp_directory_path() / ("agentkv-models-" + std::to_string(getpid()));
  fs::create_directories(root / "m1");
  fs::create_directories(root.string() + "-old/m2");
  fs::create_directory_symlink(root.string() + "-old/m2", root / "escape");
  EXPECT_TRUE(AdminApi::ModelDirUnder(root.string(), "m1").ok());
  EXPECT_TRUE(AdminApi::ModelDirUnder(root.string(), (root / "m1").string()).ok());
  EXPECT_TRUE(AdminApi::ModelDirUnder(root.string() + "/", "m1").ok());
  for (const std::string& bad :
       {std::string("../") + root.filename().string() + "-old/m2", root.string() + "-old/m2",
        std::string("escape"), std::string("."), std::string("m1/../.."), std::string("missing"),
        std::string("/")}) {
    EXPECT_FALSE(AdminApi::ModelDirUnder(root.string(), bad).ok()) << bad;
  }
  EXPECT_FALSE(AdminApi::ModelDirUnder("", "m1").ok());
  fs::remove_all(root);
  fs::remove_all(root.string() + "-old");
}

TEST(AdminApiTest, AdminEndpointsNeedTheAdminKeyOrTheLocalMode) {
  std::unique_ptr<ModelHost> served = DefaultHost();
  if (!served) GTEST_SKIP() << "default model missing";
  ModelHost& host = *served;
  agent::AgentManager agents(nullptr);
  Metrics metrics;
  // Local mode: loopback, no key.
  ApiService local({&host, &agents, &metrics}, {});
  EXPECT_EQ(Drive(local.Handle(Req("GET", "/admin/status"))).first, 200);
  // An API key users share does not open admin endpoints.
  ApiServiceOptions keyed;
  keyed.api_key = "user-key";
  ApiService shared({&host, &agents, &metrics}, keyed);
  HttpRequest r = Req("GET", "/admin/status");
  r.headers["authorization"] = "Bearer user-key";
  EXPECT_EQ(Drive(shared.Handle(r)).first, 403);
  // Nor does a non-loopback listener without a key.
  ApiServiceOptions open;
  open.guard.loopback = false;
  EXPECT_EQ(
      Drive(ApiService({&host, &agents, &metrics}, open).Handle(Req("GET", "/admin/status"))).first,
      403);
  // The admin key does; a wrong one is a 401.
  keyed.admin_key = "admin-key";
  ApiService admin({&host, &agents, &metrics}, keyed);
  EXPECT_EQ(Drive(admin.Handle(r)).first, 401);
  r.headers["authorization"] = "Bearer admin-key";
  EXPECT_EQ(Drive(admin.Handle(r)).first, 200);
  HttpRequest x = Req("GET", "/admin/status");
  x.headers["x-api-key"] = "admin-key";
  EXPECT_EQ(Drive(admin.Handle(x)).first, 200);
  // The admin key is not a user key.
  HttpRequest gen = Req("GET", "/v1/agents");
  gen.headers["x-api-key"] = "admin-key";
  EXPECT_EQ(Drive(admin.Handle(gen)).first, 401);
  (void)host.Shutdown();
}

}  // namespace
}  // namespace agentkv::api
