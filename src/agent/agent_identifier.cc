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
  return id;
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
  std::lock_guard<std::mutex> lock(mu_);
  Known& k = known_[agent];
  k.tokens = std::move(tokens);
  k.stamp = next_stamp_++;
  if (known_.size() > max_known_) {
    auto oldest = known_.begin();
    for (auto it = known_.begin(); it != known_.end(); ++it) {
      if (it->second.stamp < oldest->second.stamp) oldest = it;
    }
    known_.erase(oldest);
  }
}

void AgentIdentifier::Forget(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mu_);
  known_.erase(agent);
}

std::vector<int32_t> AgentIdentifier::Remembered(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = known_.find(agent);
  return it == known_.end() ? std::vector<int32_t>() : it->second.tokens;
}

void AgentIdentifier::ForgetAll() {
  std::lock_guard<std::mutex> lock(mu_);
  known_.clear();
}

size_t AgentIdentifier::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_.size();
}

std::pair<size_t, std::string> AgentIdentifier::Best(std::span<const int32_t> tokens) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t best = 0;
  uint64_t best_stamp = 0;
  std::string who;
  for (const auto& [id, k] : known_) {
    const size_t n = std::min(k.tokens.size(), tokens.size());
    const size_t lcp = static_cast<size_t>(
        std::mismatch(k.tokens.begin(), k.tokens.begin() + static_cast<ptrdiff_t>(n),
                      tokens.begin())
            .first -
        k.tokens.begin());
    if (lcp > best || (lcp == best && lcp > 0 && k.stamp > best_stamp)) {
      best = lcp;
      best_stamp = k.stamp;
      who = id;
    }
  }
  return {best, who};
}

std::optional<std::string> AgentIdentifier::Match(std::span<const int32_t> tokens,
                                                  size_t min_tokens) const {
  auto [lcp, who] = Best(tokens);
  if (lcp == 0 || lcp < min_tokens) return std::nullopt;
  return who;
}

Result<Identification> AgentIdentifier::Identify(
    const IdentityHints& hints, const ContentKey& key, std::span<const int32_t> tokens,
    const std::function<size_t()>& first_turn_tokens) const {
  ASSIGN_OR_RETURN(Identification id, ExplicitId(hints));
  if (!id.agent_id.empty()) return id;
  auto [lcp, who] = Best(tokens);
  if (lcp > 0) {
    const size_t need = first_turn_tokens ? first_turn_tokens() : tokens.size();
    if (lcp >= std::max<size_t>(need, 1)) return Identification{who, IdSource::kContent};
  }
  return Identification{NewAgentId(key), IdSource::kNew};
}

}  // namespace agentkv::agent
