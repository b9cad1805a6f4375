// OpenAiApi: the OpenAI-compatible endpoints, POST /v1/chat/completions and
// POST /v1/completions, whole replies or `data:` SSE chunks ending with
// `data: [DONE]`, with usage (prompt_tokens_details.cached_tokens), tool
// calls through the model's output parser, and errors shaped
// {"error": {"message", "type", "param", "code"}}.
//
// Every generation goes through the agent layer: the request's agent is
// identified (AgentBinding: prompt_cache_key, session headers, content) and
// the turn runs on that agent's strand with its KV kept for the next turn.
//
// Thread-safety: stateless apart from the ApiContext it borrows (whose
// objects must outlive it and every reply it made); call from any thread.
#pragma once

#include <string>

#include "api/agent_binding.h"
#include "api/http_types.h"
#include "api/served_model.h"

namespace agentkv::api {

class OpenAiApi {
 public:
  explicit OpenAiApi(ApiContext ctx) : ctx_(ctx) {}

  Reply ChatCompletions(const HttpRequest& req) const;
  Reply Completions(const HttpRequest& req) const;

  static HttpResponse Error(int status, const std::string& message, const std::string& param = "",
                            const std::string& code = "");

 private:
  ApiContext ctx_;
};

}  // namespace agentkv::api
