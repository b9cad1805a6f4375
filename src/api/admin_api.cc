#include "api/admin_api.h"

#include <algorithm>

#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>
#include <thread>

#include "api/callback_body.h"
#include "api/openai_api.h"

namespace agentkv::api {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json PoolJson(const cache::BlockPoolStats& p) {
  return {{"total", p.total},
          {"free", p.free},
          {"in_use", p.in_use},
          {"cached", p.cached},
          {"pinned", p.pinned},
          {"prefix_hits", p.prefix_hits},
          {"prefix_misses", p.prefix_misses},
          {"evictions", p.evictions}};
}

}  // namespace

Reply AdminApi::Status() const {
  json j = json::object();
  std::shared_ptr<ServedModel> m = ctx_.host->Current();
  j["swaps"] = ctx_.host->swaps();
  if (m) {
    const engine::EngineStats s = m->engine().Stats();
    j["model"] = {{"name", m->name()},
                  {"fingerprint", m->fingerprint()},
                  {"model_type", m->model_type()},
                  {"max_context", m->max_context()}};
    j["engine"] = {{"steps", s.steps},
                   {"waiting", s.waiting},
                   {"running", s.running},
                   {"last_batch_size", s.last_batch_size},
                   {"max_batch_size", s.max_batch_size},
                   {"preemptions", s.preemptions},
                   {"prompt_tokens", s.prompt_tokens},
                   {"generated_tokens", s.generated_tokens},
                   {"resident_agents", s.resident_agents},
                   {"kv_memory_bytes", m->engine().kv_memory_bytes()},
                   {"sequence_capacity", m->engine().sequence_capacity()}};
    // Speculative decoding: draft tokens verified and accepted, and the
    // sequence-steps that carried a draft (all 0 with --speculative none).
    j["engine"]["speculative"] = {{"draft_steps", s.draft_steps},
                                  {"draft_tokens", s.draft_tokens},
                                  {"accepted_tokens", s.draft_accepted_tokens}};
    // The host-memory KV tier (capacity 0: off).
    j["engine"]["host_kv"] = {{"capacity_bytes", s.host_kv_capacity_bytes},
                              {"bytes", s.host_kv_bytes},
                              {"blocks", s.host_kv_blocks},
                              {"hits", s.host_kv_hits},
                              {"inserts", s.host_kv_inserts},
                              {"evictions", s.host_kv_evictions},
                              {"restored_tokens", s.host_restored_tokens}};
    // Where the engine thread's time goes: steps (scheduling, launching,
    // collecting, output), of which backend launch and collect calls, and
    // the device's own busy time.
    j["engine"]["timing"] = {{"steps", s.steps},
                             {"step_seconds", s.step_seconds},
                             {"forward_seconds", s.forward_seconds},
                             {"between_steps_seconds", s.between_steps_seconds},
                             {"device_seconds", s.device_seconds}};
    // Restore or recompute: splits made, the rates they were planned with.
    j["engine"]["restore"] = {
        {"split_restores", s.split_restores},
        {"split_recomputed_tokens", s.split_recomputed_tokens},
        {"disk_restored_tokens", s.restored_tokens},
        {"disk_load_seconds", s.restore_load_seconds},
        {"disk_bytes_per_s", s.tier_bytes_per_s},
        {"disk_latency_s", s.tier_latency_s},
        {"recomputed_restores", s.recomputed_restores},
        {"host_restored_tokens", s.host_restored_tokens},
        {"host_write_seconds", s.host_write_seconds},
        {"host_write_done_seconds", s.host_write_done_seconds},
        {"disk_write_done_seconds", s.restore_write_done_seconds},
        {"prefill_seconds_per_token", s.prefill_seconds_per_token},
        {"prefill_seconds_per_token_context", s.prefill_seconds_per_token_context}};
    // Per cache group, with the pool's block count and the tokens it holds.
    const cache::ModelCacheSpec& spec = m->engine().cache_spec();
    json pools = json::array();
    for (size_t g = 0; g < s.pools.size(); ++g) {
      json p = PoolJson(s.pools[g]);
      if (g < spec.groups.size()) {
        p["attention"] = spec.groups[g].kind == cache::AttentionKind::kFull ? "full" : "sliding";
        p["layers"] = spec.groups[g].layers.size();
        p["tokens"] = static_cast<int64_t>(s.pools[g].total) * m->engine().block_size();
      }
      pools.push_back(std::move(p));
    }
    j["engine"]["groups"] = pools;
    j["pools"] = std::move(pools);
  } else {
    j["model"] = nullptr;
    j["swapping"] = true;
  }
  json agents = json::object();
  auto list = ctx_.agents->List();
  if (list.ok()) {
    // The status stays small however many agents there are: the largest
    // resident ones only (GET /v1/agents pages through all of them).
    constexpr size_t kShown = 100;
    std::vector<std::pair<int64_t, std::string>> res;
    for (const auto& a : *list)
      if (a.resident_tokens > 0) res.emplace_back(a.resident_tokens, a.id);
    const size_t shown = std::min(kShown, res.size());
    std::partial_sort(res.begin(), res.begin() + static_cast<std::ptrdiff_t>(shown), res.end(),
                      [](const auto& x, const auto& y) {
                        return x.first != y.first ? x.first > y.first : x.second < y.second;
                      });
    json resident = json::array();
    for (size_t i = 0; i < shown; ++i)
      resident.push_back({{"id", res[i].second}, {"tokens", res[i].first}});
    agents["known"] = list->size();
    agents["resident_count"] = res.size();
    agents["resident"] = std::move(resident);
  }
  agents["busy"] = ctx_.agents->strands().BusyAgents();
  const agent::ResumeCounts rc = ctx_.agents->resume_counts();
  agents["resume_sources"] = {
      {"resident", rc.resident}, {"host", rc.host}, {"disk", rc.disk}, {"recompute", rc.recompute}};
  j["agents"] = std::move(agents);
  if (store::AgentStore* st = ctx_.agents->store()) {
    auto used = st->UsedBytes();
    const store::KvStoreStats ks = st->kv_stats();
    j["store"] = {{"used_bytes", used.ok() ? static_cast<int64_t>(*used) : -1},
                  {"kv_blocks_written", ks.blocks_written},
                  {"kv_bytes_written", ks.bytes_written},
                  {"kv_blocks_evicted", ks.blocks_evicted},
                  {"kv_write_errors", ks.write_errors},
                  {"kv_write_yields", st->kv_write_yields()}};
    // Durable history appends: how long turns waited for them.
    const store::GroupCommitter::Stats hs = st->history_stats();
    j["store"]["history"] = {{"requests", hs.requests},
                             {"transactions", hs.transactions},
                             {"wait_seconds", hs.wait_seconds},
                             {"max_wait_seconds", hs.max_wait_seconds}};
  }
  HttpResponse r;
  r.body = Dump(j);
  return r;
}

Reply AdminApi::Metrics() const {
  using Sample = Metrics::Sample;
  std::vector<Sample> extra;
  std::shared_ptr<ServedModel> m = ctx_.host->Current();
  if (m) {
    const engine::EngineStats s = m->engine().Stats();
    extra.push_back({"agentkv_queue_length",
                     "Requests waiting in the engine",
                     "gauge",
                     {{"", static_cast<double>(s.waiting)}}});
    extra.push_back({"agentkv_running_requests",
                     "Requests running in the engine",
                     "gauge",
                     {{"", static_cast<double>(s.running)}}});
    extra.push_back({"agentkv_batch_size",
                     "Sequences in the last engine step",
                     "gauge",
                     {{"", static_cast<double>(s.last_batch_size)}}});
    extra.push_back({"agentkv_batch_size_max",
                     "Largest engine step so far",
                     "gauge",
                     {{"", static_cast<double>(s.max_batch_size)}}});
    extra.push_back({"agentkv_preemptions_total",
                     "Sequences preempted",
                     "counter",
                     {{"", static_cast<double>(s.preemptions)}}});
    extra.push_back({"agentkv_host_kv_bytes",
                     "Bytes of KV blocks held in the host-memory tier",
                     "gauge",
                     {{"", static_cast<double>(s.host_kv_bytes)}}});
    extra.push_back({"agentkv_host_kv_hit_blocks_total",
                     "KV blocks found in the host-memory tier",
                     "counter",
                     {{"", static_cast<double>(s.host_kv_hits)}}});
    extra.push_back({"agentkv_resident_agents",
                     "Agents with KV resident in the pool",
                     "gauge",
                     {{"", static_cast<double>(s.resident_agents)}}});
    Sample total{"agentkv_kv_blocks", "KV pool blocks by state, per cache group", "gauge", {}};
    int64_t hits = 0, misses = 0;
    for (size_t g = 0; g < s.pools.size(); ++g) {
      const auto& p = s.pools[g];
      const std::string grp = "group=\"" + std::to_string(g) + "\"";
      total.values.push_back({grp + ",state=\"total\"", p.total});
      total.values.push_back({grp + ",state=\"free\"", p.free});
      total.values.push_back({grp + ",state=\"in_use\"", p.in_use});
      total.values.push_back({grp + ",state=\"cached\"", p.cached});
      total.values.push_back({grp + ",state=\"pinned\"", p.pinned});
      hits += p.prefix_hits;
      misses += p.prefix_misses;
    }
    extra.push_back(std::move(total));
    extra.push_back({"agentkv_prefix_cache_block_hit_rate",
                     "Full blocks found by prefix lookups / blocks looked up",
                     "gauge",
                     {{"", hits + misses > 0 ? static_cast<double>(hits) / (hits + misses) : 0}}});
  }
  const agent::ResumeCounts rc = ctx_.agents->resume_counts();
  extra.push_back({"agentkv_resume_total",
                   "Agent turns after the first, by where their context came from",
                   "counter",
                   {{"source=\"resident\"", static_cast<double>(rc.resident)},
                    {"source=\"host\"", static_cast<double>(rc.host)},
                    {"source=\"disk\"", static_cast<double>(rc.disk)},
                    {"source=\"recompute\"", static_cast<double>(rc.recompute)}}});
  extra.push_back({"agentkv_agents_busy",
                   "Agents with a turn running",
                   "gauge",
                   {{"", static_cast<double>(ctx_.agents->strands().BusyAgents())}}});
  if (store::AgentStore* st = ctx_.agents->store()) {
    auto used = st->UsedBytes();
    if (used.ok()) {
      extra.push_back({"agentkv_store_bytes",
                       "Bytes in use in the agent store",
                       "gauge",
                       {{"", static_cast<double>(*used)}}});
    }
    extra.push_back({"agentkv_store_kv_blocks_written_total",
                     "KV blocks persisted",
                     "counter",
                     {{"", static_cast<double>(st->kv_stats().blocks_written)}}});
  }
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = ctx_.metrics->Render(extra);
  return r;
}

Reply AdminApi::SwapModel(const HttpRequest& req) const {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return OpenAiApi::Error(400, "the request body is not valid JSON");
  if (!body.is_object() || !body.contains("model") || !body["model"].is_string() ||
      body["model"].get<std::string>().empty()) {
    return OpenAiApi::Error(400, "'model' (a checkpoint directory) is required", "model");
  }
  const std::string asked = body["model"].get<std::string>();
  Result<std::string> dir = ModelDirUnder(models_dir_, asked);
  if (!dir.ok()) return OpenAiApi::Error(403, dir.status().message(), "model");
  ModelHost* host = ctx_.host;
  agent::AgentManager* agents = ctx_.agents;
  auto work = [host, agents, dir = *dir, asked](CallbackBody::ReplyFn reply) {
    // Draining waits for running generations: on the host's swap worker,
    // never on an io thread.
    const bool started = host->StartSwap(dir, [host, agents, asked, reply](auto r) {
      agents->ForgetResident();
      if (auto now = host->Current()) {
        // Content matching follows the model: its tokenizer, its stored chains.
        (void)AgentBinding::RememberStoredAgents(*now, *agents);
      }
      if (!r.ok()) {
        // The loader's message may quote the files it read: it goes to the
        // log; the client learns only which kind of failure it was.
        std::cerr << "model swap to " << asked << " failed: " << r.status().ToString() << "\n";
        if (r.status().code() == StatusCode::kCancelled) {
          return reply(OpenAiApi::Error(503, "the server is shutting down", "model"));
        }
        return reply(OpenAiApi::Error(
            400,
            r.status().code() == StatusCode::kNotFound
                ? "cannot load " + asked + ": it is not a complete checkpoint directory"
                : "cannot load " + asked + ": not a checkpoint this server can serve (see its log)",
            "model"));
      }
      json j = {{"object", "model.swap"},
                {"old_model", r->old_model},
                {"new_model", r->new_model},
                {"old_fingerprint", r->old_fingerprint},
                {"new_fingerprint", r->new_fingerprint},
                {"drain_s", r->drain_s},
                {"flush_s", r->flush_s},
                {"load_s", r->load_s}};
      if (!r->warning.empty()) j["warning"] = r->warning;
      HttpResponse resp;
      resp.body = Dump(j);
      reply(std::move(resp));
    });
    if (!started) {
      reply(
          OpenAiApi::Error(409, "another model swap is under way; retry when it is done", "model"));
    }
  };
  return std::unique_ptr<AsyncBody>(new CallbackBody(work, ctx_.metrics, "/admin/model"));
}

Result<std::string> AdminApi::ModelDirUnder(const std::string& models_dir,
                                            const std::string& asked) {
  namespace fs = std::filesystem;
  if (models_dir.empty()) return InvalidArgument("model swaps are off: start with --models-dir");
  std::error_code ec;
  const fs::path root = fs::canonical(models_dir, ec);
  if (ec) return InvalidArgument("--models-dir " + models_dir + " does not exist");
  // Relative names are inside the models directory; absolute ones must be.
  const fs::path want = fs::path(asked).is_absolute() ? fs::path(asked) : root / asked;
  const fs::path dir = fs::canonical(want, ec);
  const std::string refusal = asked + " is not a directory under --models-dir " + models_dir;
  if (ec || !fs::is_directory(dir, ec)) return InvalidArgument(refusal);
  // Component-wise: /models-old is not under /models, and symbolic links
  // were resolved by canonical(), so none leads out.
  auto r = root.begin(), d = dir.begin();
  for (; r != root.end(); ++r, ++d) {
    if (d == dir.end() || *r != *d) return InvalidArgument(refusal);
  }
  if (d == dir.end()) return InvalidArgument(refusal);  // the models directory itself
  return dir.string();
}

}  // namespace agentkv::api
