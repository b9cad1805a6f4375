// AgentIdentifier: which agent a request belongs to (SPEC section 4). First
// match wins:
//   1. the path id of /v1/agents/{id}/...;
//   2. an explicit id: the body's `session_id` or `agent_id`, OpenAI's
//      `prompt_cache_key`, the X-Session-Id header, Claude Code's
//      X-Claude-Code-Session-Id header, or the session inside Anthropic
//      `metadata.user_id` ("user_<hash>_account_<uuid>_session_<uuid>", or
//      a JSON object with "session_id");
//   3. content: the known agent whose remembered token sequence (prompt and
//      generated tokens of its last turn) shares the longest prefix with the
//      request's tokens, provided that prefix covers at least the system
//      prompt and the first turn;
//   4. a new agent, "auto-" + a hash of the normalized system prompt and
//      first user message.
// With tenants, each step sees only the request's tenant's agents (ids are
// scoped: Scope), so two tenants never share an agent, even with the same
// explicit id or the same prompts.
// Volatile lines clients put in system prompts (Claude Code's
// `x-anthropic-billing-header: ...`) are removed (StripVolatileLines) by the
// protocol adapters before rendering, so they take part neither in the
// tokens that are matched nor in the hash.
//
// Thread-safety: the static functions are pure; the content index (Remember,
// Forget, Match, Identify) is guarded by a mutex and may be used from any
// thread; matching compares sequences outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace agentkv::agent {

// The explicit identifiers a request carries (empty: absent). The protocol
// adapters fill it from the path, body and headers.
struct IdentityHints {
  std::string path_id;           // /v1/agents/{id}/...
  std::string body_id;           // body "session_id", else "agent_id"
  std::string prompt_cache_key;  // OpenAI body "prompt_cache_key"
  std::string session_header;    // X-Session-Id
  std::string claude_session;    // X-Claude-Code-Session-Id
  std::string metadata_user_id;  // Anthropic body metadata.user_id
  // The authenticated tenant (--api-keys), or "" without tenants. Set by the
  // server, never from the request: every id chosen is scoped to it.
  std::string tenant;
};

// What content identification looks at, already normalized.
struct ContentKey {
  std::string system;      // system prompt, volatile lines removed
  std::string first_user;  // text of the first user message
};

enum class IdSource { kPath, kExplicit, kContent, kNew };
std::string_view IdSourceName(IdSource s);  // "path", "explicit", "content", "new"

struct Identification {
  std::string agent_id;
  IdSource source = IdSource::kNew;
};

class AgentIdentifier {
 public:
  // Removes every line starting with "x-anthropic-billing-header:" (case
  // insensitive, leading blanks allowed) and the blank lines it leaves at the
  // start; the rest is unchanged.
  static std::string StripVolatileLines(std::string_view system);
  // The session id inside a Claude Code metadata.user_id, or nullopt.
  static std::optional<std::string> SessionFromUserId(std::string_view user_id);
  // The first explicit id of `hints` in SPEC order (path first), or "" when
  // there is none, scoped to hints.tenant. InvalidArgument when the chosen
  // id is not a valid agent id (1..256 bytes with the scope, no NUL).
  static Result<Identification> ExplicitId(const IdentityHints& hints);
  // Tenants: agents of tenant T are stored and run as "T/ID" (tenant names
  // have no '/', so the first one splits), and nothing of one tenant's is
  // reachable under another's scope. Without a tenant, ids are unchanged.
  static Result<std::string> Scope(std::string_view tenant, std::string_view id);
  // The id a tenant knows its agent by (Scope undone); `scoped` unchanged
  // without a tenant.
  static std::string Unscope(std::string_view tenant, std::string_view scoped);
  // "T/" ("" without a tenant): the prefix of the tenant's scoped ids.
  static std::string ScopePrefix(std::string_view tenant);
  // "auto-" + 16 hex digits of a hash of the key (trailing blanks of each
  // part ignored).
  static std::string NewAgentId(const ContentKey& key);

  // At most `max_known` agents and `max_tokens` tokens in all are
  // remembered for content matching; past either the least recently
  // remembered is forgotten (it can still be found by its explicit or
  // hashed id). The newest sequence is kept even when it alone is larger.
  explicit AgentIdentifier(size_t max_known = 4096, size_t max_tokens = 32ull << 20)
      : max_known_(max_known), max_tokens_(max_tokens) {}

  // Remembers (replaces) `agent`'s token sequence for content matching.
  void Remember(const std::string& agent, std::vector<int32_t> tokens);
  void Forget(const std::string& agent);
  // The remembered token sequence of `agent` (its last turn's prompt and
  // generated tokens, or its stored chain after a restart); empty if none.
  std::vector<int32_t> Remembered(const std::string& agent) const;
  void ForgetAll();
  size_t size() const;
  // Tokens remembered, in all.
  size_t tokens() const;
  size_t capacity() const { return max_known_; }

  // The known agent sharing the longest common prefix with `tokens`, if that
  // prefix is at least `min_tokens` long (and at least 1), among the agents
  // whose id starts with `scope` (ScopePrefix: one tenant's). Ties go to the
  // most recently remembered.
  std::optional<std::string> Match(std::span<const int32_t> tokens, size_t min_tokens,
                                   std::string_view scope = {}) const;

  // The whole rule above. `first_turn_tokens` computes how many tokens the
  // system prompt and first turn take; it is only called when content
  // matching has a candidate.
  Result<Identification> Identify(const IdentityHints& hints, const ContentKey& key,
                                  std::span<const int32_t> tokens,
                                  const std::function<size_t()>& first_turn_tokens) const;

 private:
  struct Known {
    // Immutable once remembered: Best compares against it outside the lock.
    std::shared_ptr<const std::vector<int32_t>> tokens;
    uint64_t stamp = 0;
  };
  // Longest common prefix of `tokens` with any known sequence, and who. The
  // lock is held only to take a snapshot of the sequences (pointers), not
  // while they are compared.
  std::pair<size_t, std::string> Best(std::span<const int32_t> tokens,
                                      std::string_view scope) const;

  const size_t max_known_;
  const size_t max_tokens_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Known> known_;
  size_t total_tokens_ = 0;
  uint64_t next_stamp_ = 1;
};

}  // namespace agentkv::agent
