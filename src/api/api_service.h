// ApiService: routes HTTP requests to the protocol adapters (OpenAI,
// Anthropic) and answers the small endpoints itself: GET /health, HEAD /,
// GET /v1/models. Checks the optional API key (Authorization: Bearer or
// x-api-key; 401 in the protocol's shape). Never throws: anything that
// escapes an adapter becomes a 500 in the protocol's shape.
//
// Thread-safety: Handle may be called concurrently. Borrows the
// ServedModel, which must outlive the service and every reply it made.
#pragma once

#include <string>

#include "api/anthropic_api.h"
#include "api/http_types.h"
#include "api/openai_api.h"
#include "api/served_model.h"

namespace agentkv::api {

struct ApiServiceOptions {
  std::string api_key;  // empty: no key needed
};

class ApiService {
 public:
  ApiService(const ServedModel* model, ApiServiceOptions options);

  Reply Handle(const HttpRequest& req) const;

 private:
  Reply Route(const HttpRequest& req) const;
  bool Authorized(const HttpRequest& req) const;

  const ServedModel* model_;
  ApiServiceOptions options_;
  OpenAiApi openai_;
  AnthropicApi anthropic_;
};

}  // namespace agentkv::api
