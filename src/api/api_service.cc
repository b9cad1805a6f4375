#include "api/api_service.h"

#include <ctime>
#include <exception>
#include <nlohmann/json.hpp>

namespace agentkv::api {
namespace {

using nlohmann::json;

HttpResponse Json(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

bool IsAnthropic(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

}  // namespace

ApiService::ApiService(const ServedModel* model, ApiServiceOptions options)
    : model_(model), options_(std::move(options)), openai_(model), anthropic_(model) {}

bool ApiService::Authorized(const HttpRequest& req) const {
  if (options_.api_key.empty()) return true;
  if (req.Header("x-api-key") == options_.api_key) return true;
  const std::string auth = req.Header("authorization");
  return auth == "Bearer " + options_.api_key || auth == "bearer " + options_.api_key;
}

Reply ApiService::Handle(const HttpRequest& req) const {
  try {
    return Route(req);
  } catch (const std::exception& e) {
    const std::string msg = std::string("internal error: ") + e.what();
    if (IsAnthropic(req.path)) return AnthropicApi::Error(500, msg, "api_error");
    return OpenAiApi::Error(500, msg);
  } catch (...) {
    if (IsAnthropic(req.path)) return AnthropicApi::Error(500, "internal error", "api_error");
    return OpenAiApi::Error(500, "internal error");
  }
}

Reply ApiService::Route(const HttpRequest& req) const {
  const std::string& p = req.path;
  const bool get = req.method == "GET", post = req.method == "POST";
  if (p == "/health" && get) return Json(200, {{"status", "ok"}});
  if (p == "/" && (req.method == "HEAD" || get)) return Json(200, {{"status", "ok"}});
  if (!Authorized(req)) {
    if (IsAnthropic(p))
      return AnthropicApi::Error(401, "invalid x-api-key", "authentication_error");
    return OpenAiApi::Error(401, "invalid API key", "", "invalid_api_key");
  }
  if (p == "/v1/models" && get) {
    json m = {{"id", model_->name()},
              {"object", "model"},
              {"created", static_cast<int64_t>(std::time(nullptr))},
              {"owned_by", "agentkv"},
              {"max_model_len", model_->max_context()}};
    return Json(200, {{"object", "list"}, {"data", json::array({m})}});
  }
  if (p.rfind("/v1/models/", 0) == 0 && get) {
    // Any id names the one model served (clients look up what they asked for).
    return Json(200, {{"id", p.substr(11)},
                      {"object", "model"},
                      {"created", static_cast<int64_t>(std::time(nullptr))},
                      {"owned_by", "agentkv"},
                      {"max_model_len", model_->max_context()}});
  }
  if (p == "/v1/chat/completions" && post) return openai_.ChatCompletions(req);
  if (p == "/v1/completions" && post) return openai_.Completions(req);
  if (p == "/v1/messages" && post) return anthropic_.Messages(req);
  if (p == "/v1/messages/count_tokens" && post) return anthropic_.CountTokens(req);
  if (IsAnthropic(p))
    return AnthropicApi::Error(404, "no route " + req.method + " " + p, "not_found_error");
  return OpenAiApi::Error(404, "no route " + req.method + " " + p, "", "not_found");
}

}  // namespace agentkv::api
