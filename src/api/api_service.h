// ApiService: routes HTTP requests to the protocol adapters (OpenAI,
// Anthropic, agents, admin) and answers the small endpoints itself:
// GET /health, HEAD /, GET /v1/models. `/v1/batch/...` mirrors every
// generation endpoint at LOW priority. Checks the optional API key
// (Authorization: Bearer or x-api-key; 401 in the protocol's shape) on
// everything but /health and HEAD /, after the RequestGuard's checks
// (browsers: 403 / 415). Refuses POST bodies nested deeper
// than max_json_depth with a 400 in the protocol's shape. Counts answered requests in the
// metrics by route and status. Never throws: anything that escapes an
// adapter becomes a 500 in the protocol's shape.
//
// With --api-keys (ApiServiceOptions::tenants) each key belongs to a
// tenant, and requests are served in their tenant's scope (see there).
//
// Thread-safety: Handle and SetTenants may be called concurrently. Borrows the
// ApiContext's objects, which must outlive the service and every reply it
// made.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "api/admin_api.h"
#include "api/agent_binding.h"
#include "api/agents_api.h"
#include "api/anthropic_api.h"
#include "api/http_types.h"
#include "api/openai_api.h"
#include "api/request_guard.h"
#include "api/tenant_keys.h"

namespace agentkv::api {

struct ApiServiceOptions {
  std::string api_key;  // empty: no key needed
  // POST bodies nested deeper than this (arrays and objects) get a 400
  // before anything parses them (see api/json_depth.h).
  int max_json_depth = 64;
  // Origin / Host / Content-Type checks (api/request_guard.h).
  RequestGuardOptions guard;
  // /admin/* needs this key (x-api-key or Bearer). Empty: admin endpoints
  // work only in the single-user local mode (guard.loopback and no
  // api_key), where whoever can reach the server owns it.
  std::string admin_key;
  // POST /admin/model loads only directories under this one (empty: off).
  std::string models_dir;
  // --api-keys: key -> tenant. Set: only its keys are accepted (not
  // api_key), and each request is served in its tenant's scope: agents,
  // histories, content matching and cached KV (its requests' cache salt,
  // AgentBinding::CacheSalt) of other tenants are out of its reach.
  // Null: today's single-user behaviour (api_key or none).
  std::shared_ptr<const TenantKeys> tenants;
};

class ApiService {
 public:
  ApiService(ApiContext ctx, ApiServiceOptions options);

  Reply Handle(const HttpRequest& req) const;
  // Replaces the tenants table (SIGHUP reload); requests already admitted
  // keep the tenant they were given. Null is refused (keeps the old one):
  // turning tenants off needs a restart.
  void SetTenants(std::shared_ptr<const TenantKeys> tenants);

  // The metrics label of a path: the route with ids replaced by {id}.
  static std::string RouteLabel(const std::string& path);
  // The request body limit of a route: `generation_limit` for the POST
  // generation endpoints (chat, completions, messages, count_tokens, agent
  // generate and their /v1/batch mirrors), 1 MiB for everything else.
  static uint64_t BodyLimit(const std::string& method, const std::string& path,
                            uint64_t generation_limit);
  // Whether a request's handling may block (parsing, rendering and
  // tokenizing a body, reading or waiting for the store) and belongs on the
  // worker pool (HttpServerOptions::offload): everything but liveness,
  // metrics and the model list.
  static bool Offload(const HttpRequest& req);

 private:
  Reply Route(const HttpRequest& req) const;
  // Everything past the key check; `req` carries its tenant.
  Reply RouteAuthorized(const HttpRequest& req) const;
  // Whether the request's key is accepted; its tenant into `tenant`.
  bool Authorized(const HttpRequest& req, Tenant* tenant) const;
  // 0 when the request may use /admin/*, else the status to refuse it with.
  int AdminRefusal(const HttpRequest& req) const;

  ApiContext ctx_;
  ApiServiceOptions options_;
  mutable std::mutex tenants_mu_;
  std::shared_ptr<const TenantKeys> tenants_;  // guarded by tenants_mu_
  OpenAiApi openai_;
  AnthropicApi anthropic_;
  AgentsApi agents_;
  AdminApi admin_;
};

}  // namespace agentkv::api
