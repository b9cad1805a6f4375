// ApiFuzzService: the HTTP API as the protocol fuzz targets drive it: the
// default (random-weight) model served on the CPU backend, an agent
// manager without a store, and an ApiService with the server's default
// options, built once per process. FuzzPost sends one POST the way the HTTP
// server hands it over (JSON content type, a loopback Host) and drops the
// reply: an error reply is complete already; a generation is never
// started (destroying it cancels the turn before it reaches the engine), so
// each input costs only parsing, identification, template rendering and
// tokenizing, the code an attacker reaches with a request body.
//
// Thread-safety: one fuzzing thread; the service is never destroyed (the
// engine thread would otherwise race the process exit).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <variant>

#include "agent/agent_manager.h"
#include "api/api_service.h"
#include "api/metrics.h"
#include "api/model_host.h"
#include "api/served_model.h"

namespace agentkv::fuzz {

inline api::ApiService& FuzzService() {
  static api::ApiService* service = [] {
    api::ServedModelOptions o;
    o.model_dir = std::string(AGENTKV_DATA_DIR) + "/models/default";
    if (!std::filesystem::exists(o.model_dir + "/config.json")) {
      std::fprintf(stderr, "fuzz: %s is missing (run scripts/setup.sh)\n", o.model_dir.c_str());
      std::abort();
    }
    o.backend.threads = 1;
    o.max_batch = 4;
    o.kv_memory_bytes = 32ull << 20;
    o.host_kv_memory_bytes = 0;
    auto model = api::ServedModel::Load(o);
    if (!model.ok()) {
      std::fprintf(stderr, "fuzz: loading the default model: %s\n",
                   model.status().ToString().c_str());
      std::abort();
    }
    auto* host = new api::ModelHost(o, std::move(model).value());
    auto* agents = new agent::AgentManager(nullptr);
    auto* metrics = new api::Metrics();
    return new api::ApiService({host, agents, metrics}, api::ApiServiceOptions{});
  }();
  return *service;
}

// Sends `body` to POST `path`; returns the status of an immediate reply, or
// 0 for a generation (dropped unstarted).
inline int FuzzPost(const std::string& path, std::string body) {
  api::HttpRequest req;
  req.method = "POST";
  req.path = path;
  req.headers["content-type"] = "application/json";
  req.headers["host"] = "127.0.0.1:8080";
  req.body = std::move(body);
  api::Reply reply = FuzzService().Handle(req);
  if (auto* r = std::get_if<api::HttpResponse>(&reply)) {
    // A 5xx is a server bug for any body a client can send: stop here so the
    // input is kept. (A model swap or a full queue cannot happen in this
    // process; those are the only legitimate 5xx answers.)
    if (r->status >= 500) {
      std::fprintf(stderr, "fuzz: %s answered %d: %s\n", path.c_str(), r->status, r->body.c_str());
      std::abort();
    }
    return r->status;
  }
  return 0;
}

}  // namespace agentkv::fuzz

// Loads the model before fuzzing starts (each target includes this header
// once), so the first input is not reported as a slow unit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  agentkv::fuzz::FuzzService();
  return 0;
}
