#include "api/agent_binding.h"

#include "store/store_kv_tier.h"

namespace agentkv::api {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

std::string StringField(const json& body, const char* key) {
  if (!body.is_object() || !body.contains(key) || !body[key].is_string()) return "";
  return body[key].get<std::string>();
}

}  // namespace

agent::IdentityHints AgentBinding::Hints(const HttpRequest& req, const json& body) {
  agent::IdentityHints h;
  h.body_id = StringField(body, "session_id");
  if (h.body_id.empty()) h.body_id = StringField(body, "agent_id");
  h.prompt_cache_key = StringField(body, "prompt_cache_key");
  h.session_header = req.Header("x-session-id");
  h.claude_session = req.Header("x-claude-code-session-id");
  h.tenant = req.tenant;
  if (body.is_object() && body.contains("metadata") && body["metadata"].is_object()) {
    h.metadata_user_id = StringField(body["metadata"], "user_id");
  }
  return h;
}

Result<std::string> AgentBinding::CacheSalt(const HttpRequest& req, const json& body) {
  std::string salt;
  if (body.is_object() && body.contains("cache_salt") && !body["cache_salt"].is_null()) {
    const json& s = body["cache_salt"];
    if (!s.is_string()) return InvalidArgument("'cache_salt' must be a string");
    salt = s.get<std::string>();
    if (salt.empty()) return InvalidArgument("'cache_salt' must not be empty");
    if (salt.size() > kMaxCacheSaltBytes)
      return InvalidArgument("'cache_salt' is longer than " + std::to_string(kMaxCacheSaltBytes) +
                             " bytes");
  }
  if (req.tenant.empty() && salt.empty()) return std::string();
  // Length-prefixed: tenant "ab" with salt "c" never meets tenant "a" with
  // salt "bc".
  return std::to_string(req.tenant.size()) + ":" + req.tenant + salt;
}

agent::ContentKey AgentBinding::NormalizeSystem(ordered_json* messages) {
  agent::ContentKey key;
  bool have_user = false;
  for (auto& m : *messages) {
    if (!m.is_object() || !m.contains("role")) continue;
    const std::string role = m["role"].is_string() ? m["role"].get<std::string>() : "";
    if ((role == "system" || role == "developer") && m.contains("content") &&
        m["content"].is_string()) {
      m["content"] = agent::AgentIdentifier::StripVolatileLines(m["content"].get<std::string>());
      if (!key.system.empty()) key.system += "\n";
      key.system += m["content"].get<std::string>();
    } else if (role == "user" && !have_user) {
      have_user = true;
      if (m.contains("content") && m["content"].is_string()) {
        key.first_user = m["content"].get<std::string>();
      }
    }
  }
  return key;
}

Result<agent::Identification> AgentBinding::Identify(
    const ServedModel& model, agent::AgentManager& agents, const agent::IdentityHints& hints,
    const agent::ContentKey& key, const ordered_json& messages, const ordered_json& tools,
    const ordered_json& extra, std::span<const int32_t> tokens) {
  auto first_turn = [&]() -> size_t {
    ordered_json head = ordered_json::array();
    for (const auto& m : messages) {
      head.push_back(m);
      if (m.value("role", "") == "user") break;
    }
    auto t = model.EncodeChat(head, tools, extra, /*add_generation_prompt=*/false);
    return t.ok() ? t->size() : tokens.size();
  };
  return agents.identifier().Identify(hints, key, tokens, first_turn);
}

ordered_json AgentBinding::NewMessages(const ordered_json& messages) {
  size_t start = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].is_object() && messages[i].value("role", "") == "assistant") start = i + 1;
  }
  ordered_json out = ordered_json::array();
  for (size_t i = start; i < messages.size(); ++i) out.push_back(messages[i]);
  return out;
}

Result<size_t> AgentBinding::RememberStoredAgents(const ServedModel& model,
                                                  agent::AgentManager& agents) {
  auto* tier = dynamic_cast<store::StoreKvTier*>(model.kv_tier());
  if (tier == nullptr) return size_t{0};
  return agents.RememberStoredChains(tier->fingerprint());
}

Status AgentBinding::SwapInProgress() {
  return Cancelled("a model swap is in progress; retry shortly");
}

engine::ReplySplice AgentBinding::ReuseReply(const ServedModel& model, agent::AgentManager& agents,
                                             const std::string& agent_id, std::string_view text,
                                             std::vector<int32_t> ids) {
  const std::vector<int32_t> previous = agents.identifier().Remembered(agent_id);
  if (previous.empty()) return engine::ReplySplice{std::move(ids)};
  const text::Tokenizer& tok = model.tokenizer();
  return engine::SpliceReplyTokens(
      previous, [&tok](int32_t id) { return tok.TokenBytes(id); },
      [&tok](int32_t id) { return tok.IsAdded(id); }, text, ids,
      [&tok](std::string_view rest) { return tok.Encode(rest, /*add_special_tokens=*/false); });
}

agent::PrepareFn AgentBinding::Prepare(ModelHost* host, std::shared_ptr<ServedModel> model,
                                       std::vector<int32_t> prompt, engine::SamplingParams params,
                                       engine::Priority priority, std::string cache_salt,
                                       Reencode reencode, ReplyReuse reuse) {
  return [host, model = std::move(model), prompt = std::move(prompt), params = std::move(params),
          priority, cache_salt = std::move(cache_salt), reencode = std::move(reencode),
          reuse = std::move(reuse)]() -> Result<agent::TurnStart> {
    std::shared_ptr<ServedModel> now = host->Current();
    if (!now) return SwapInProgress();
    std::vector<int32_t> p = prompt;
    if (now != model) {
      if (!reencode) return SwapInProgress();
      ASSIGN_OR_RETURN(p, reencode(*now));
    } else if (reuse.agents != nullptr) {
      p = ReuseReply(*now, *reuse.agents, reuse.agent_id, reuse.text, std::move(p)).ids;
    }
    agent::TurnStart s;
    ASSIGN_OR_RETURN(s.request, now->MakeRequest(std::move(p), params, priority));
    s.request.cache_salt = cache_salt;
    s.engine = &now->engine();
    s.keep_alive = now;
    return s;
  };
}

}  // namespace agentkv::api
