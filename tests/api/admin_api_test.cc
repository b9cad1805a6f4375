// AdminApi through ApiService on the default model: /admin/status fields,
// /metrics after a generation, and POST /admin/model input checks (the
// swap itself: model_host_test and the e2e test).
#include "api/admin_api.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "api/api_service.h"

namespace agentkv::api {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::pair<int, std::string> Drive(Reply reply) {
  if (auto* r = std::get_if<HttpResponse>(&reply)) return {r->status, r->body};
  auto& b = std::get<std::unique_ptr<AsyncBody>>(reply);
  b->Start([] {});
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!b->Poll(&out) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return {b->status(), out};
}

HttpRequest Req(const std::string& method, const std::string& path, const std::string& body = "") {
  HttpRequest r;
  r.method = method;
  r.path = path;
  r.body = body;
  return r;
}

TEST(AdminApiTest, StatusMetricsAndSwapInput) {
  const fs::path dir = fs::path(AGENTKV_DATA_DIR) / "models/default";
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << "default model missing";
  ServedModelOptions o;
  o.model_dir = dir.string();
  o.backend.threads = 1;
  auto m = ServedModel::Load(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ModelHost host(o, std::move(m).value());
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
  EXPECT_FALSE(s.contains("store"));  // no store

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
  std::tie(st, body) =
      Drive(svc.Handle(Req("POST", "/admin/model", R"({"model":"/no/such/model"})")));
  EXPECT_EQ(st, 400) << body;
  ASSERT_NE(host.Current(), nullptr);  // the old model serves again
  EXPECT_EQ(host.Current()->name(), "default");
  (void)host.Shutdown();
}

}  // namespace
}  // namespace agentkv::api
