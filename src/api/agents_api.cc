#include "api/agents_api.h"

#include <charconv>
#include <nlohmann/json.hpp>

#include "api/callback_body.h"
#include "api/generation_job.h"
#include "api/json_template.h"
#include "api/openai_api.h"
#include "api/openai_logprobs.h"
#include "api/query_params.h"
#include "api/response_format.h"
#include "engine/finish_reason.h"
#include "store/store_kv_tier.h"
#include "util/hash.h"

namespace agentkv::api {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpResponse FromStatus(const Status& s, const std::string& param = "") {
  int status = HttpStatusFor(s);
  if (s.code() == StatusCode::kNotFound) status = 404;
  HttpResponse r = OpenAiApi::Error(status, s.message(), param);
  if (status == 429 || status == 503) r.headers["retry-after"] = "1";
  return r;
}

HttpResponse Json(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = Dump(body);
  return r;
}

// The agent's messages: every turn's, the latest system message first (a
// later "system" replaces an earlier one), then `user` if not empty.
Result<ordered_json> BuildMessages(agent::AgentManager& agents, const std::string& id,
                                   const std::string& system, const std::string& user) {
  ordered_json msgs = ordered_json::array();
  std::string sys;
  auto history = agents.History(id);
  if (!history.ok() && history.status().code() != StatusCode::kNotFound) {
    return history.status();
  }
  if (history.ok()) {
    for (const std::string& turn : *history) {
      ordered_json t = ordered_json::parse(turn, nullptr, false);
      if (!t.is_array()) continue;
      for (auto& m : t) {
        if (m.is_object() && m.value("role", "") == "system") {
          sys = m.value("content", "");
        } else {
          msgs.push_back(std::move(m));
        }
      }
    }
  }
  if (!system.empty()) sys = system;
  ordered_json out = ordered_json::array();
  if (!sys.empty()) out.push_back({{"role", "system"}, {"content", sys}});
  for (auto& m : msgs) out.push_back(std::move(m));
  if (!user.empty()) out.push_back({{"role", "user"}, {"content", user}});
  return out;
}

class AgentJob : public GenerationJob {
 public:
  // `shown_id`: the id the client knows the agent by (unscoped).
  AgentJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn,
           text::output::OutputParserOptions parser, bool stream, ordered_json new_messages,
           std::string shown_id)
      : GenerationJob(ctx, std::move(turn), std::move(parser), stream, std::move(new_messages),
                      "/v1/agents/{id}/generate"),
        shown_id_(std::move(shown_id)) {}

 protected:
  void OnEvents(const std::vector<text::output::OutputEvent>& events, std::string* out) override {
    std::string chunk;
    for (const text::output::OutputEvent& e : events) {
      if (e.kind == text::output::OutputEvent::Kind::kText) chunk += e.text;
    }
    if (chunk.empty()) return;
    text_ += chunk;
    if (stream_) {
      if (text_event_.empty()) {
        text_event_ = JsonTemplate("data: ", Dump({{"text", JsonTemplate::kHole}}), "\n\n");
      }
      text_event_.Render(chunk, out);
    }
  }

  void OnFinish(const engine::RequestOutput& f, std::string* out) override {
    std::string finish(engine::FinishReasonName(f.finish));
    if (finish.empty()) finish = "stop";
    json reply = {{"agent_id", shown_id_},
                  {"turn", turn_number_},
                  {"text", text_},
                  {"finish_reason", finish},
                  {"usage",
                   {{"prompt_tokens", f.prompt_tokens},
                    {"completion_tokens", f.completion_tokens},
                    {"cached_tokens", f.cached_tokens},
                    {"restored_tokens", f.restored_tokens},
                    {"cache_source", std::string(engine::CacheSourceName(Source(f)))}}}};
    if (stream_) {
      *out += "data: " + Dump(reply) + "\n\n";
    } else {
      *out = Dump(reply);
    }
  }

  void OnError(const Status& error, std::string* out) override {
    json body = {{"error",
                  {{"message", error.message()},
                   {"type", status_ >= 500 ? "server_error" : "invalid_request_error"},
                   {"param", nullptr},
                   {"code", nullptr}}}};
    if (stream_) {
      *out += "data: " + Dump(body) + "\n\n";
    } else {
      *out = Dump(body);
    }
  }

  ordered_json ReplyMessage() const override { return {{"role", "assistant"}, {"content", text_}}; }

 private:
  std::string shown_id_;
  static engine::CacheSource Source(const engine::RequestOutput& f) {
    if (f.cache_source == engine::CacheSource::kNone && f.cached_tokens > 0)
      return engine::CacheSource::kResident;
    return f.cached_tokens > 0 ? f.cache_source : engine::CacheSource::kNone;
  }
  std::string text_;
  JsonTemplate text_event_;  // {"text": ...}, serialized once
};

json InfoJson(const agent::AgentInfo& a) {
  return {{"id", a.id},
          {"object", "agent"},
          {"turns", a.turns},
          {"created_ms", a.created_ms},
          {"last_used_ms", a.last_used_ms},
          {"pending", a.pending},
          {"resident_tokens", a.resident_tokens},
          {"last_turn",
           {{"prompt_tokens", a.last_prompt_tokens},
            {"cached_tokens", a.last_cached_tokens},
            {"cache_source", std::string(engine::CacheSourceName(a.last_cache_source))}}}};
}

}  // namespace

Reply AgentsApi::Generate(const HttpRequest& req, const std::string& path_id) const {
  agent::IdentityHints hints;
  hints.path_id = path_id;
  hints.tenant = req.tenant;
  auto id = agent::AgentIdentifier::ExplicitId(hints);
  if (!id.ok()) return FromStatus(id.status());
  const std::string agent_id = id->agent_id;  // scoped to the tenant
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return OpenAiApi::Error(400, "the request body is not valid JSON");
  if (!body.is_object()) return OpenAiApi::Error(400, "the request body must be a JSON object");
  if (!body.contains("message")) return OpenAiApi::Error(400, "'message' is required", "message");
  if (!body["message"].is_string()) {
    return OpenAiApi::Error(400, "'message' must be a string", "message");
  }
  const std::string message = body["message"].get<std::string>();
  if (message.empty()) return OpenAiApi::Error(400, "'message' must not be empty", "message");
  std::string system;
  if (body.contains("system") && !body["system"].is_null()) {
    if (!body["system"].is_string()) {
      return OpenAiApi::Error(400, "'system' must be a string", "system");
    }
    system = agent::AgentIdentifier::StripVolatileLines(body["system"].get<std::string>());
  }
  engine::SamplingParams params;
  if (Status s = ParseSampling(body, "stop", &params); !s.ok()) return FromStatus(s);
  // One reply per turn: the server keeps the agent's history, which has
  // room for one continuation (the OpenAI endpoints continue the agent
  // with choice 0 only).
  if (auto n = ParseChoiceCount(body); !n.ok() || *n != 1) {
    return OpenAiApi::Error(400, "'n' must be 1 for an agent's turn", "n");
  }
  std::optional<int64_t> max_tokens;
  if (Status s = GetOptionalInt(body, "max_tokens", &max_tokens); !s.ok()) {
    return FromStatus(s, "max_tokens");
  }
  if (max_tokens) {
    params.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
  }
  bool stream = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return OpenAiApi::Error(400, "'stream' must be a boolean");
    stream = body["stream"].get<bool>();
  }
  auto priority = ServedModel::RequestPriority(req, body);
  if (!priority.ok()) return FromStatus(priority.status(), "priority");
  auto cache_salt = AgentBinding::CacheSalt(req, body);
  if (!cache_salt.ok()) return FromStatus(cache_salt.status(), "cache_salt");
  std::shared_ptr<ServedModel> model = ctx_.host->Current();
  if (!model) return FromStatus(AgentBinding::SwapInProgress());

  // Checked now against the current history, so that bad input is a 4xx;
  // rendered again when the turn runs (earlier turns may still be queued).
  auto msgs = BuildMessages(*ctx_.agents, agent_id, system, message);
  if (!msgs.ok()) return FromStatus(msgs.status());
  std::string text;  // the rendered prompt: whether the reply may think first
  auto prompt = model->EncodeChat(*msgs, nullptr, ordered_json::object(), true, &text);
  if (!prompt.ok()) return FromStatus(prompt.status(), "message");
  if (auto g = ParseResponseFormat(req.body, body, *model, /*chat=*/true, &text); !g.ok()) {
    return FromStatus(g.status(), "response_format");
  } else {
    params.grammar = *g;
  }
  if (auto r = model->MakeRequest(*prompt, params, *priority); !r.ok()) {
    return FromStatus(r.status(), "message");
  }

  agent::AgentManager* agents = ctx_.agents;
  ModelHost* host = ctx_.host;
  const engine::Priority prio = *priority;
  agent::PrepareFn prepare = [agents, host, agent_id, system, message, params, prio,
                              salt = std::move(cache_salt).value()]() -> Result<agent::TurnStart> {
    std::shared_ptr<ServedModel> now = host->Current();
    if (!now) return AgentBinding::SwapInProgress();
    ASSIGN_OR_RETURN(ordered_json m, BuildMessages(*agents, agent_id, system, message));
    std::string text;
    ASSIGN_OR_RETURN(std::vector<int32_t> p,
                     now->EncodeChat(m, nullptr, ordered_json::object(), true, &text));
    p = AgentBinding::ReuseReply(*now, *agents, agent_id, text, std::move(p)).ids;
    agent::TurnStart s;
    ASSIGN_OR_RETURN(s.request, now->MakeRequest(std::move(p), params, prio));
    s.request.cache_salt = salt;
    s.engine = &now->engine();
    s.keep_alive = now;
    return s;
  };
  auto turn = ctx_.agents->NewTurn(agent_id, std::move(prepare));
  if (!system.empty()) turn->set_system_hash(Hex64(Xxh3_64(system)));
  ordered_json record = ordered_json::array();
  if (!system.empty()) record.push_back({{"role", "system"}, {"content", system}});
  record.push_back({{"role", "user"}, {"content", message}});
  auto parser = ServedModel::ParserOptions(model, false, text);
  return std::unique_ptr<AsyncBody>(
      new AgentJob(ctx_, std::move(turn), parser, stream, std::move(record), path_id));
}

Reply AgentsApi::List(const HttpRequest& req) const {
  int64_t limit = kDefaultListLimit;
  if (auto v = QueryParam(req.query, "limit")) {
    int64_t n = 0;
    const char* end = v->data() + v->size();
    auto [p, ec] = std::from_chars(v->data(), end, n);
    if (ec != std::errc() || p != end || n < 1 || n > kMaxListLimit) {
      return OpenAiApi::Error(
          400, "'limit' must be an integer from 1 to " + std::to_string(kMaxListLimit), "limit");
    }
    limit = n;
  }
  // Only the tenant's agents: its scope, and ids shown as it knows them.
  const std::string scope = agent::AgentIdentifier::ScopePrefix(req.tenant);
  const std::string after = QueryParam(req.query, "after").value_or("");
  auto page =
      ctx_.agents->List(after.empty() ? after : scope + after, static_cast<size_t>(limit), scope);
  if (!page.ok()) return FromStatus(page.status());
  json data = json::array();
  for (auto& a : page->agents) {
    a.id = agent::AgentIdentifier::Unscope(req.tenant, a.id);
    data.push_back(InfoJson(a));
  }
  json first = page->agents.empty() ? json(nullptr) : json(page->agents.front().id);
  json last = page->agents.empty() ? json(nullptr) : json(page->agents.back().id);
  return Json(200, {{"object", "list"},
                    {"data", std::move(data)},
                    {"has_more", page->has_more},
                    {"first_id", std::move(first)},
                    {"last_id", std::move(last)}});
}

Reply AgentsApi::Get(const HttpRequest& req, const std::string& path_id) const {
  agent::IdentityHints hints;
  hints.path_id = path_id;
  hints.tenant = req.tenant;
  auto id = agent::AgentIdentifier::ExplicitId(hints);
  if (!id.ok()) return FromStatus(id.status());
  const std::string agent_id = id->agent_id;  // scoped to the tenant
  auto info = ctx_.agents->Get(agent_id);
  if (!info.ok()) {
    // Named as the client knows it (never the tenant's scope).
    if (info.status().code() == StatusCode::kNotFound) {
      return FromStatus(NotFound("no agent '" + path_id + "'"));
    }
    return FromStatus(info.status());
  }
  info->id = path_id;
  json j = InfoJson(*info);
  auto history = ctx_.agents->History(agent_id);
  json h = json::array();
  if (history.ok()) {
    for (size_t i = 0; i < history->size(); ++i) {
      json t = json::parse((*history)[i], nullptr, false);
      h.push_back({{"turn", i + 1}, {"messages", t.is_discarded() ? json::array() : t}});
    }
  }
  j["history"] = std::move(h);
  // Where the cache lives: resident in the pool (as of its last turn here),
  // and stored on disk under each model's fingerprint.
  json stored = json::array();
  std::shared_ptr<ServedModel> model = ctx_.host->Current();
  int64_t disk_tokens = 0;
  if (store::AgentStore* st = ctx_.agents->store()) {
    auto sum = st->Summarize(agent_id);
    // KV records are tagged with the model's KV fingerprint (model, KV
    // format, block size), which the store tier derives.
    std::string current_fp;
    if (auto* tier = model ? dynamic_cast<store::StoreKvTier*>(model->kv_tier()) : nullptr) {
      current_fp = tier->fingerprint().Hex();
    }
    if (sum.ok()) {
      const int bs = model ? model->engine().block_size() : 16;
      for (const auto& kv : sum->kv) {
        const bool current = !current_fp.empty() && kv.fp.Hex() == current_fp;
        if (current) disk_tokens = static_cast<int64_t>(kv.stored_blocks) * bs;
        stored.push_back({{"fingerprint", kv.fp.Hex()},
                          {"current_model", current},
                          {"chain_blocks", kv.chain_blocks},
                          {"stored_blocks", kv.stored_blocks},
                          {"stored_bytes", kv.stored_bytes}});
      }
    }
  }
  const char* where = info->resident_tokens > 0 ? "resident" : disk_tokens > 0 ? "disk" : "none";
  j["cache"] = {{"location", where},
                {"resident_tokens", info->resident_tokens},
                {"disk_tokens", disk_tokens},
                {"stored", std::move(stored)}};
  return Json(200, j);
}

Reply AgentsApi::Delete(const HttpRequest& req, const std::string& path_id) const {
  agent::IdentityHints hints;
  hints.path_id = path_id;
  hints.tenant = req.tenant;
  auto id = agent::AgentIdentifier::ExplicitId(hints);
  if (!id.ok()) return FromStatus(id.status());
  const std::string agent_id = id->agent_id;  // scoped to the tenant
  agent::AgentManager* agents = ctx_.agents;
  ModelHost* host = ctx_.host;
  auto work = [agents, host, agent_id, path_id](CallbackBody::ReplyFn reply) {
    agents->Delete(
        agent_id,
        [host, agent_id] {
          if (auto m = host->Current()) m->engine().DropAgent(agent_id);
        },
        [reply, path_id](Status s) {
          if (s.code() == StatusCode::kNotFound) s = NotFound("no agent '" + path_id + "'");
          if (!s.ok()) return reply(FromStatus(s));
          reply(Json(200, {{"id", path_id}, {"object", "agent.deleted"}, {"deleted", true}}));
        });
  };
  return std::unique_ptr<AsyncBody>(new CallbackBody(work, ctx_.metrics, "/v1/agents/{id}"));
}

}  // namespace agentkv::api
