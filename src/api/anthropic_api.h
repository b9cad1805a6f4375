// AnthropicApi: the Anthropic Messages endpoints, POST /v1/messages and
// POST /v1/messages/count_tokens. Requests (system as string or blocks,
// role "system" entries folded into it, text / tool_use / tool_result
// blocks, tools with input_schema) are converted to the OpenAI-style
// messages the chat template expects; replies are whole messages or the SSE
// sequence message_start, content_block_start, ping, content_block_delta,
// content_block_stop, message_delta, message_stop. max_tokens is clamped to
// the context left. Errors are {"type":"error","error":{"type","message"}}.
//
// Thread-safety: stateless apart from the ServedModel it borrows (which must
// outlive it and every reply it made); call from any thread.
#pragma once

#include <string>

#include "api/http_types.h"
#include "api/served_model.h"

namespace agentkv::api {

class AnthropicApi {
 public:
  explicit AnthropicApi(const ServedModel* model) : model_(model) {}

  Reply Messages(const HttpRequest& req) const;
  Reply CountTokens(const HttpRequest& req) const;

  static HttpResponse Error(int status, const std::string& message,
                            const std::string& type = "invalid_request_error");

 private:
  const ServedModel* model_;
};

}  // namespace agentkv::api
