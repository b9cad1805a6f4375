// AgentsApi: the agents endpoints (SPEC section 7), where the server keeps
// the history:
//   POST /v1/agents/{id}/generate {"message", "system"?, "max_tokens"?,
//        sampling fields, "stop"?, "priority"?, "stream"?}
//     -> {"agent_id", "turn", "text", "finish_reason", "usage":
//         {"prompt_tokens", "completion_tokens", "cached_tokens",
//          "cache_source"}}; streamed: SSE `data: {"text": ...}` events and
//        a last event with the reply's fields.
//   GET /v1/agents?limit=N&after=ID: a page of agents by id, OpenAI's list
//   shape ({"object": "list", "data", "has_more", "first_id", "last_id"};
//   limit 1 to 1000, default 100; `after` is the last id of the previous
//   page), GET /v1/agents/{id} (history and where the cache lives),
//   DELETE /v1/agents/{id} (history and KV everywhere).
// The prompt of a turn is the agent's history (the latest system message
// first), then the new user message, rendered when the turn runs on the
// agent's strand, so it sees every earlier turn. Errors have the OpenAI
// shape.
//
// Thread-safety: stateless apart from the ApiContext it borrows (whose
// objects must outlive it and every reply it made); call from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "api/agent_binding.h"
#include "api/http_types.h"

namespace agentkv::api {

class AgentsApi {
 public:
  explicit AgentsApi(ApiContext ctx) : ctx_(ctx) {}

  // `path_id`: the id in the path, as the client knows it; with tenants it
  // is scoped to the request's tenant (agent::AgentIdentifier::Scope).
  Reply Generate(const HttpRequest& req, const std::string& path_id) const;
  Reply List(const HttpRequest& req) const;

  static constexpr int64_t kDefaultListLimit = 100;
  static constexpr int64_t kMaxListLimit = 1000;
  Reply Get(const HttpRequest& req, const std::string& path_id) const;
  Reply Delete(const HttpRequest& req, const std::string& path_id) const;

 private:
  ApiContext ctx_;
};

}  // namespace agentkv::api
