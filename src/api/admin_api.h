// AdminApi: GET /admin/status (model, engine queue and running batch, block
// pools, agents and which are resident, store), GET /metrics (Prometheus
// text format: Metrics plus gauges sampled now: queue length, running
// batch, largest batch, pool usage, prefix cache hit rate, resume sources,
// store size), and POST /admin/model {"model": "<dir>"}, the hot-swap of
// SPEC section 6 (ModelHost::StartSwap, on the host's worker; the reply
// comes when the new model serves), from directories under --models-dir
// only. Errors have the OpenAI shape. Who may call them is ApiService's
// business (--admin-key, or the single-user local mode).
//
// Thread-safety: stateless apart from the ApiContext it borrows (whose
// objects must outlive it and every reply it made); call from any thread.
#pragma once

#include <string>

#include "api/agent_binding.h"
#include "api/http_types.h"

namespace agentkv::api {

class AdminApi {
 public:
  // Swaps load only directories under `models_dir` (empty: swaps are off).
  AdminApi(ApiContext ctx, std::string models_dir)
      : ctx_(ctx), models_dir_(std::move(models_dir)) {}

  Reply Status() const;
  Reply Metrics() const;
  // 403 for a directory outside the models directory, 409 while another
  // swap runs; errors never quote the files the loader read.
  Reply SwapModel(const HttpRequest& req) const;

  // The canonical directory `asked` names (relative: inside `models_dir`)
  // if it lies strictly under `models_dir` once symbolic links are
  // resolved; InvalidArgument otherwise.
  static Result<std::string> ModelDirUnder(const std::string& models_dir, const std::string& asked);

 private:
  ApiContext ctx_;
  std::string models_dir_;
};

}  // namespace agentkv::api
