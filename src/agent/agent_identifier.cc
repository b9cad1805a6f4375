#include "agent/agent_identifier.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "store/records.h"
#include "util/hash.h"

namespace agentkv::agent {
namespace {

constexpr std::string_view kBillingHeader = "x-anthropic-billing-header:";

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view IdSourceName(IdSource s) {
  switch (s) {
    case IdSource::kPath:
      return "path";
    case IdSource::kExplicit:
      return "explicit";
    case IdSource::kContent:
      return "content";
    case IdSource::kNew:
      return "new";
  }
  return "new";
}

std::string AgentIdentifier::StripVolatileLines(std::string_view system) {
  std::string out;
  out.reserve(system.size());
  bool removed = false;
  size_t pos = 0;
  while (pos < system.size()) {
    size_t nl = system.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? system.size() : nl + 1;
    std::string_view line = system.substr(pos, end - pos);
    size_t lead = 0;
    while (lead < line.size() && (line[lead] == ' ' || line[lead] == '\t')) ++lead;
    if (StartsWithNoCase(line.substr(lead), kBillingHeader)) {
      removed = true;
    } else if (removed && out.empty() && TrimRight(line).empty()) {
      // A blank line the removed header left at the start.
    } else {
      out.append(line);
    }
    pos = end;
  }
  return removed ? out : std::string(system);
}

std::optional<std::string> AgentIdentifier::SessionFromUserId(std::string_view user_id) {
  if (user_id.empty()) return std::nullopt;
  if (user_id.front() == '{') {
    const auto j = nlohmann::json::parse(user_id, nullptr, false);
    if (j.is_object() && j.contains("session_id") && j["session_id"].is_string() &&
        !j["session_id"].get<std::string>().empty()) {
      return j["session_id"].get<std::string>();
    }
    return std::nullopt;
  }
  constexpr std::string_view kMark = "_session_";
  const size_t at = user_id.rfind(kMark);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view session = user_id.substr(at + kMark.size());
  if (session.empty()) return std::nullopt;
  return std::string(session);
}

Result<Identification> AgentIdentifier::ExplicitId(const IdentityHints& h) {
  Identification id;
  if (!h.path_id.empty()) {
    id = {h.path_id, IdSource::kPath};
  } else {
    std::string from_user;
    if (auto s = SessionFromUserId(h.metadata_user_id)) from_user = *s;
    const std::string* order[] = {&h.body_id, &h.prompt_cache_key, &h.session_header,
                                  &h.claude_session, &from_user};
    for (const std::string* c : order) {
      if (!c->empty()) {
        id = {*c, IdSource::kExplicit};
        break;
      }
    }
  }
  if (id.agent_id.empty()) return id;
  if (Status s = store::ValidateAgentId(id.agent_id); !s.ok()) {
    return InvalidArgument("bad agent id: " + s.message());
  }
  ASSIGN_OR_RETURN(id.agent_id, Scope(h.tenant, id.agent_id));
  return id;
}

Result<std::string> AgentIdentifier::Scope(std::string_view tenant, std::string_view id) {
  if (tenant.empty()) return std::string(id);
  std::string scoped = ScopePrefix(tenant);
  scoped += id;
  if (Status s = store::ValidateAgentId(scoped); !s.ok()) {
    return InvalidArgument("bad agent id: at most " + std::to_string(256 - tenant.size() - 1) +
                           " bytes for this tenant's agents");
  }
  return scoped;
}

std::string AgentIdentifier::Unscope(std::string_view tenant, std::string_view scoped) {
  const std::string prefix = ScopePrefix(tenant);
  if (!prefix.empty() && scoped.substr(0, prefix.size()) == prefix) {
    scoped.remove_prefix(prefix.size());
  }
  return std::string(scoped);
}

std::string AgentIdentifier::ScopePrefix(std::string_view tenant) {
  return tenant.empty() ? std::string() : std::string(tenant) + "/";
}

std::string AgentIdentifier::NewAgentId(const ContentKey& key) {
  Xxh3Hasher128 h(0x61676b76);  // "agkv"
  const std::string_view system = TrimRight(key.system);
  const std::string_view user = TrimRight(key.first_user);
  h.UpdateU64(system.size());
  h.Update(system);
  h.UpdateU64(user.size());
  h.Update(user);
  return "auto-" + Hex64(h.Digest().high);
}

void AgentIdentifier::Remember(const std::string& agent, std::vector<int32_t> tokens) {
  auto seq = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  std::lock_guard<std::mutex> lock(mu_);
  Known& k = known_[agent];
  if (k.tokens) total_tokens_ -= k.tokens->size();
  total_tokens_ += seq->size();
  k.tokens = std::move(seq);
  k.stamp = next_stamp_++;
  while (known_.size() > 1 && (known_.size() > max_known_ || total_tokens_ > max_tokens_)) {
    auto oldest = known_.begin();
    for (auto it = known_.begin(); it != known_.end(); ++it) {
      if (it->second.stamp < oldest->second.stamp) oldest = it;
    }
    total_tokens_ -= oldest->second.tokens->size();
    known_.erase(oldest);
  }
}

void AgentIdentifier::Forget(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = known_.find(agent);
  if (it == known_.end()) return;
  total_tokens_ -= it->second.tokens->size();
  known_.erase(it);
}

std::vector<int32_t> AgentIdentifier::Remembered(const std::string& agent) const {
  std::shared_ptr<const std::vector<int32_t>> seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = known_.find(agent);
    if (it == known_.end()) return {};
    seq = it->second.tokens;
  }
  return *seq;
}

void AgentIdentifier::ForgetAll() {
  std::lock_guard<std::mutex> lock(mu_);
  known_.clear();
  total_tokens_ = 0;
}

size_t AgentIdentifier::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_.size();
}

size_t AgentIdentifier::tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_tokens_;
}

std::pair<size_t, std::string> AgentIdentifier::Best(std::span<const int32_t> tokens,
                                                     std::string_view scope) const {
  struct Candidate {
    std::string id;
    std::shared_ptr<const std::vector<int32_t>> seq;
    uint64_t stamp;
  };
  std::vector<Candidate> snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot.reserve(known_.size());
    for (const auto& [id, k] : known_) {
      // Only sequences that agree on the first token can share a prefix.
      if (tokens.empty() || k.tokens->empty() || k.tokens->front() != tokens.front()) continue;
      if (!scope.empty() && id.compare(0, scope.size(), scope) != 0) continue;  // another tenant's
      snapshot.push_back(Candidate{id, k.tokens, k.stamp});
    }
  }
  size_t best = 0;
  uint64_t best_stamp = 0;
  const std::string* who = nullptr;
  for (const Candidate& c : snapshot) {
    const std::vector<int32_t>& seq = *c.seq;
    const size_t n = std::min(seq.size(), tokens.size());
    const size_t lcp = static_cast<size_t>(
        std::mismatch(seq.begin(), seq.begin() + static_cast<ptrdiff_t>(n), tokens.begin()).first -
        seq.begin());
    if (lcp > best || (lcp == best && lcp > 0 && c.stamp > best_stamp)) {
      best = lcp;
      best_stamp = c.stamp;
      who = &c.id;
    }
  }
  return {best, who ? *who : std::string()};
}

std::optional<std::string> AgentIdentifier::Match(std::span<const int32_t> tokens,
                                                  size_t min_tokens, std::string_view scope) const {
  auto [lcp, who] = Best(tokens, scope);
  if (lcp == 0 || lcp < min_tokens) return std::nullopt;
  return who;
}

Result<Identification> AgentIdentifier::Identify(
    const IdentityHints& hints, const ContentKey& key, std::span<const int32_t> tokens,
    const std::function<size_t()>& first_turn_tokens) const {
  ASSIGN_OR_RETURN(Identification id, ExplicitId(hints));
  if (!id.agent_id.empty()) return id;
  auto [lcp, who] = Best(tokens, ScopePrefix(hints.tenant));
  if (lcp > 0) {
    const size_t need = first_turn_tokens ? first_turn_tokens() : tokens.size();
    if (lcp >= std::max<size_t>(need, 1)) return Identification{who, IdSource::kContent};
  }
  ASSIGN_OR_RETURN(std::string fresh, Scope(hints.tenant, NewAgentId(key)));
  return Identification{std::move(fresh), IdSource::kNew};
}

}  // namespace agentkv::agent
