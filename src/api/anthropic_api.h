// AnthropicApi: the Anthropic Messages endpoints, POST /v1/messages and
// POST /v1/messages/count_tokens. Requests (system as string or blocks,
// role "system" entries folded into it, text / tool_use / tool_result
// blocks, tools with input_schema) are converted to the OpenAI-style
// messages the chat template expects; replies are whole messages or the SSE
// sequence message_start, content_block_start, ping, content_block_delta,
// content_block_stop, message_delta, message_stop. max_tokens is clamped to
// the context left. Errors are {"type":"error","error":{"type","message"}}.
//
// Generations go through the agent layer (AgentBinding): the agent is the
// X-Claude-Code-Session-Id header, the session in metadata.user_id, another
// explicit id, or found by content; Claude Code's billing-header line is
// stripped from the system prompt before rendering.
//
// Thread-safety: stateless apart from the ApiContext it borrows (whose
// objects must outlive it and every reply it made); call from any thread.
#pragma once

#include <string>

#include "api/agent_binding.h"
#include "api/http_types.h"
#include "api/served_model.h"

namespace agentkv::api {

class AnthropicApi {
 public:
  explicit AnthropicApi(ApiContext ctx) : ctx_(ctx) {}

  Reply Messages(const HttpRequest& req) const;
  Reply CountTokens(const HttpRequest& req) const;

  static HttpResponse Error(int status, const std::string& message,
                            const std::string& type = "invalid_request_error");

 private:
  ApiContext ctx_;
};

}  // namespace agentkv::api
