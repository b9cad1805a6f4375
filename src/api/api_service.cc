#include "api/api_service.h"

#include <cctype>
#include <ctime>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>

#include "api/api_key.h"
#include "api/json_depth.h"
#include "api/query_params.h"

namespace agentkv::api {
namespace {

using nlohmann::json;

HttpResponse Json(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

bool IsAnthropic(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 || path.rfind("/v1/batch/messages", 0) == 0;
}

constexpr std::string_view kAgents = "/v1/agents/";

constexpr std::string_view kBatch = "/v1/batch/";

}  // namespace

ApiService::ApiService(ApiContext ctx, ApiServiceOptions options)
    : ctx_(ctx),
      options_(std::move(options)),
      tenants_(options_.tenants),
      openai_(ctx),
      anthropic_(ctx),
      agents_(ctx),
      admin_(ctx, options_.models_dir) {}

void ApiService::SetTenants(std::shared_ptr<const TenantKeys> tenants) {
  if (!tenants) return;
  std::lock_guard<std::mutex> lock(tenants_mu_);
  tenants_ = std::move(tenants);
}

int ApiService::AdminRefusal(const HttpRequest& req) const {
  if (options_.admin_key.empty()) {
    return options_.guard.loopback && options_.api_key.empty() && !options_.tenants ? 0 : 403;
  }
  const std::string x_api_key = req.Header("x-api-key");
  const std::string authorization = req.Header("authorization");
  const bool by_header = KeysEqual(x_api_key, options_.admin_key);
  const bool by_bearer = KeysEqual(PresentedKey("", authorization), options_.admin_key);
  return by_header || by_bearer ? 0 : 401;
}

bool ApiService::Authorized(const HttpRequest& req, Tenant* tenant) const {
  std::shared_ptr<const TenantKeys> tenants;
  {
    std::lock_guard<std::mutex> lock(tenants_mu_);
    tenants = tenants_;
  }
  if (tenants) {
    // Either header may carry the key, as below.
    const std::string x_api_key = req.Header("x-api-key");
    const std::string authorization = req.Header("authorization");
    const Tenant* t = tenants->Find(x_api_key);
    if (t == nullptr) t = tenants->Find(PresentedKey("", authorization));
    if (t == nullptr) return false;
    *tenant = *t;
    return true;
  }
  if (options_.api_key.empty()) return true;
  const std::string x_api_key = req.Header("x-api-key");
  const std::string authorization = req.Header("authorization");
  // Either header may carry it (some clients send both): both are compared.
  const bool by_header = KeysEqual(x_api_key, options_.api_key);
  const bool by_bearer = KeysEqual(PresentedKey("", authorization), options_.api_key);
  return by_header || by_bearer;
}

std::string ApiService::RouteLabel(const std::string& path) {
  std::string p = path;
  std::string prefix;
  if (p.rfind(kBatch, 0) == 0) {
    prefix = "/v1/batch";
    p = "/v1/" + p.substr(kBatch.size());
  }
  if (p.rfind(kAgents, 0) == 0) {
    const std::string rest = p.substr(kAgents.size());
    const size_t slash = rest.find('/');
    p = slash == std::string::npos ? "/v1/agents/{id}" : "/v1/agents/{id}" + rest.substr(slash);
  } else if (p.rfind("/v1/models/", 0) == 0) {
    p = "/v1/models/{id}";
  }
  static const char* kKnown[] = {"/",
                                 "/health",
                                 "/v1/models",
                                 "/v1/models/{id}",
                                 "/v1/chat/completions",
                                 "/v1/completions",
                                 "/v1/messages",
                                 "/v1/messages/count_tokens",
                                 "/v1/agents",
                                 "/v1/agents/{id}",
                                 "/v1/agents/{id}/generate",
                                 "/admin/status",
                                 "/admin/model",
                                 "/metrics"};
  for (const char* k : kKnown) {
    if (p == k) return prefix.empty() ? p : prefix + p.substr(3);  // "/v1/batch/chat/..."
  }
  return "other";
}

uint64_t ApiService::BodyLimit(const std::string& method, const std::string& path,
                               uint64_t generation_limit) {
  constexpr uint64_t kSmall = 1ull << 20;
  if (method != "POST") return kSmall;
  const std::string route = RouteLabel(path);
  const std::string p = route.rfind(kBatch, 0) == 0 ? "/v1/" + route.substr(kBatch.size()) : route;
  if (p == "/v1/chat/completions" || p == "/v1/completions" || p == "/v1/messages" ||
      p == "/v1/messages/count_tokens" || p == "/v1/agents/{id}/generate") {
    return generation_limit;
  }
  return kSmall;
}

bool ApiService::Offload(const HttpRequest& req) {
  if (req.method != "GET" && req.method != "HEAD") return true;
  const std::string& p = req.path;
  return !(p == "/" || p == "/health" || p == "/metrics" || p == "/v1/models" ||
           p.rfind("/v1/models/", 0) == 0);
}

Reply ApiService::Handle(const HttpRequest& req) const {
  Reply reply;
  try {
    reply = Route(req);
  } catch (const std::exception& e) {
    // The exception's text may quote the request or files the server read:
    // it goes to the log, never to the client.
    std::cerr << "internal error on " << req.method << " " << RouteLabel(req.path) << ": "
              << e.what() << "\n";
    reply = IsAnthropic(req.path) ? AnthropicApi::Error(500, "internal error", "api_error")
                                  : OpenAiApi::Error(500, "internal error");
  } catch (...) {
    reply = IsAnthropic(req.path) ? AnthropicApi::Error(500, "internal error", "api_error")
                                  : OpenAiApi::Error(500, "internal error");
  }
  // Async bodies count themselves when they complete.
  if (auto* r = std::get_if<HttpResponse>(&reply); r && ctx_.metrics) {
    ctx_.metrics->CountRequest(RouteLabel(req.path), r->status);
  }
  return reply;
}

Reply ApiService::Route(const HttpRequest& req) const {
  const bool get = req.method == "GET", post = req.method == "POST";
  if (GuardVerdict v = CheckRequest(req, options_.guard); v.status != 0) {
    if (IsAnthropic(req.path)) {
      return AnthropicApi::Error(v.status, v.message,
                                 v.status == 403 ? "permission_error" : "invalid_request_error");
    }
    return OpenAiApi::Error(v.status, v.message);
  }
  if (req.path == "/health" && get) return Json(200, {{"status", "ok"}});
  if (req.path == "/" && (req.method == "HEAD" || get)) return Json(200, {{"status", "ok"}});
  if (req.path.rfind("/admin/", 0) == 0) {
    if (const int refusal = AdminRefusal(req); refusal != 0) {
      return OpenAiApi::Error(refusal,
                              refusal == 401
                                  ? "admin endpoints need the admin key (--admin-key)"
                                  : "admin endpoints are off: start the server with --admin-key "
                                    "(or on loopback without --api-key)",
                              "", refusal == 401 ? "invalid_api_key" : "");
    }
    if (req.path == "/admin/status" && get) return admin_.Status();
    if (req.path == "/admin/model" && post) return admin_.SwapModel(req);
    return OpenAiApi::Error(404, "no route " + req.method + " " + req.path, "", "not_found");
  }
  Tenant tenant;
  if (!Authorized(req, &tenant)) {
    if (IsAnthropic(req.path)) {
      return AnthropicApi::Error(401, "invalid x-api-key", "authentication_error");
    }
    return OpenAiApi::Error(401, "invalid API key", "", "invalid_api_key");
  }
  if (!tenant.name.empty()) {
    HttpRequest scoped = req;
    scoped.tenant = tenant.name;
    scoped.high_priority_allowed = tenant.high_priority;
    return RouteAuthorized(scoped);
  }
  return RouteAuthorized(req);
}

Reply ApiService::RouteAuthorized(const HttpRequest& req) const {
  const bool get = req.method == "GET", post = req.method == "POST";
  if (post && JsonNestingDepth(req.body, options_.max_json_depth) > options_.max_json_depth) {
    const std::string msg = "the request body nests arrays and objects deeper than " +
                            std::to_string(options_.max_json_depth) + " levels";
    if (IsAnthropic(req.path)) return AnthropicApi::Error(400, msg, "invalid_request_error");
    return OpenAiApi::Error(400, msg);
  }
  // /v1/batch/X mirrors /v1/X at LOW priority.
  if (req.path.rfind(kBatch, 0) == 0 && post) {
    HttpRequest low = req;
    low.path = "/v1/" + req.path.substr(kBatch.size());
    low.headers["x-priority"] = "low";
    if (low.path.rfind("/v1/batch/", 0) == 0) {
      return OpenAiApi::Error(404, "no route " + req.method + " " + req.path, "", "not_found");
    }
    return RouteAuthorized(low);
  }
  const std::string& p = req.path;
  if (p == "/v1/models" && get) {
    std::shared_ptr<ServedModel> m = ctx_.host->Current();
    json data = json::array();
    if (m) {
      data.push_back({{"id", m->name()},
                      {"object", "model"},
                      {"created", static_cast<int64_t>(std::time(nullptr))},
                      {"owned_by", "agentkv"},
                      {"max_model_len", m->max_context()}});
    }
    return Json(200, {{"object", "list"}, {"data", std::move(data)}});
  }
  if (p.rfind("/v1/models/", 0) == 0 && get) {
    // Any id names the one model served (clients look up what they asked for).
    std::shared_ptr<ServedModel> m = ctx_.host->Current();
    return Json(200, {{"id", p.substr(11)},
                      {"object", "model"},
                      {"created", static_cast<int64_t>(std::time(nullptr))},
                      {"owned_by", "agentkv"},
                      {"max_model_len", m ? m->max_context() : 0}});
  }
  if (p == "/v1/chat/completions" && post) return openai_.ChatCompletions(req);
  if (p == "/v1/completions" && post) return openai_.Completions(req);
  if (p == "/v1/messages" && post) return anthropic_.Messages(req);
  if (p == "/v1/messages/count_tokens" && post) return anthropic_.CountTokens(req);
  if (p == "/v1/agents" && get) return agents_.List(req);
  if (p.rfind(kAgents, 0) == 0) {
    const std::string rest = p.substr(kAgents.size());
    const size_t slash = rest.find('/');
    const std::string id = PercentDecode(rest.substr(0, slash));
    if (!id.empty()) {
      if (slash == std::string::npos) {
        if (get) return agents_.Get(req, id);
        if (req.method == "DELETE") return agents_.Delete(req, id);
      } else if (rest.substr(slash) == "/generate" && post) {
        return agents_.Generate(req, id);
      }
    }
  }
  if (p == "/metrics" && get) return admin_.Metrics();
  if (IsAnthropic(p)) {
    return AnthropicApi::Error(404, "no route " + req.method + " " + p, "not_found_error");
  }
  return OpenAiApi::Error(404, "no route " + req.method + " " + p, "", "not_found");
}

}  // namespace agentkv::api
