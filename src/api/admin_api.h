// AdminApi: GET /admin/status (model, engine queue and running batch, block
// pools, agents and which are resident, store), GET /metrics (Prometheus
// text format: Metrics plus gauges sampled now: queue length, running
// batch, largest batch, pool usage, prefix cache hit rate, resume sources,
// store size), and POST /admin/model {"model": "<dir>"}, the hot-swap of
// SPEC section 6 (ModelHost::Swap on a thread of its own; the reply comes
// when the new model serves). Errors have the OpenAI shape.
//
// Thread-safety: stateless apart from the ApiContext it borrows (whose
// objects must outlive it and every reply it made); call from any thread.
#pragma once

#include "api/agent_binding.h"
#include "api/http_types.h"

namespace agentkv::api {

class AdminApi {
 public:
  explicit AdminApi(ApiContext ctx) : ctx_(ctx) {}

  Reply Status() const;
  Reply Metrics() const;
  Reply SwapModel(const HttpRequest& req) const;

 private:
  ApiContext ctx_;
};

}  // namespace agentkv::api
