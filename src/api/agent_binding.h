// AgentBinding: what the protocol adapters share to put a request through
// the agent layer: the explicit ids a request carries (path, body, headers,
// Anthropic metadata), the normalized system prompt and first user message
// (volatile billing-header lines stripped, before rendering, so they take
// part neither in the tokens that are matched nor in the hash), agent
// identification, the turn's new messages for the history, and the
// PrepareFn that submits an already rendered prompt.
//
// ApiContext: the shared objects every adapter borrows; they outlive the
// service and every reply it made.
//
// Thread-safety: stateless functions; call from any thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent_manager.h"
#include "api/http_types.h"
#include "api/metrics.h"
#include "api/model_host.h"
#include "api/served_model.h"
#include "engine/reply_splice.h"
#include "util/task_pool.h"

namespace agentkv::api {

struct ApiContext {
  ModelHost* host = nullptr;
  agent::AgentManager* agents = nullptr;
  Metrics* metrics = nullptr;
  // Blocking work of replies (recording a finished turn: the history's
  // fsync, then the agent's next turn starting) runs here, off the
  // connection's io thread; null: inline.
  TaskPool* workers = nullptr;
};

// What a chat turn needs to reuse the agent's own reply: the agent and the
// rendered prompt text. Null `agents`: no reuse (raw completions).
struct ReplyReuse {
  agent::AgentManager* agents = nullptr;
  std::string agent_id;
  std::string text;
};

class AgentBinding {
 public:
  // Body "session_id" / "agent_id" / "prompt_cache_key" /
  // "metadata.user_id" and the X-Session-Id / X-Claude-Code-Session-Id
  // headers (non-string body fields are ignored).
  static agent::IdentityHints Hints(const HttpRequest& req, const nlohmann::json& body);

  // The engine's cache salt (EngineRequest::cache_salt) for a request: its
  // tenant (req.tenant, set by the server from the key) and the body's
  // optional "cache_salt" string (vLLM's), "<tenant bytes>:<tenant><body
  // salt>" so that no two (tenant, salt) pairs meet; "" when both are empty
  // (no tenants, no body salt: the unsalted cache of a single user).
  // InvalidArgument when "cache_salt" is not a string, is empty or is longer
  // than kMaxCacheSaltBytes. A null "cache_salt" is absent.
  static constexpr size_t kMaxCacheSaltBytes = 1024;
  static Result<std::string> CacheSalt(const HttpRequest& req, const nlohmann::json& body);

  // Strips volatile lines from every system message of `messages` (OpenAI
  // shape, content strings) in place; returns the system prompt and first
  // user message for identification.
  static agent::ContentKey NormalizeSystem(nlohmann::ordered_json* messages);

  // Identifies the agent of a chat request whose rendered prompt is
  // `tokens`. The first-turn length for content matching is the rendering
  // of the system messages and the first user message.
  static Result<agent::Identification> Identify(
      const ServedModel& model, agent::AgentManager& agents, const agent::IdentityHints& hints,
      const agent::ContentKey& key, const nlohmann::ordered_json& messages,
      const nlohmann::ordered_json& tools, const nlohmann::ordered_json& extra,
      std::span<const int32_t> tokens);

  // The messages a turn adds to the history: everything after the last
  // assistant message (all of them when there is none).
  static nlohmann::ordered_json NewMessages(const nlohmann::ordered_json& messages);

  // The prompt of a turn of `agent_id` whose rendered text is `text` and
  // whose normal tokenization by `model` is `ids`: the agent's remembered
  // tokens (its previous prompt and the reply the engine generated, or its
  // stored chain after a restart) wherever the text agrees with them byte
  // for byte, then the rest of the text tokenized normally
  // (SpliceReplyTokens). Call when the turn runs on the agent's strand, so
  // the previous turn has finished and its tokens are remembered.
  static engine::ReplySplice ReuseReply(const ServedModel& model, agent::AgentManager& agents,
                                        const std::string& agent_id, std::string_view text,
                                        std::vector<int32_t> ids);

  // A PrepareFn submitting `prompt` (rendered by `model`) under
  // `cache_salt` (CacheSalt) on the model serving when the turn runs,
  // spliced by ReuseReply when `reuse` names an agent. If the model was
  // swapped meanwhile, `reencode` renders the request again with the new
  // one (without reply reuse). Unavailable (kCancelled, 503) while a swap is
  // under way.
  using Reencode = std::function<Result<std::vector<int32_t>>(const ServedModel&)>;
  static agent::PrepareFn Prepare(ModelHost* host, std::shared_ptr<ServedModel> model,
                                  std::vector<int32_t> prompt, engine::SamplingParams params,
                                  engine::Priority priority, std::string cache_salt,
                                  Reencode reencode, ReplyReuse reuse = {});

  // The 503 status every adapter answers while no model is serving.
  static Status SwapInProgress();

  // Makes content matching know the agents whose KV `model` can use (the
  // stored chains under its KV fingerprint): after start-up and after a
  // model swap. No-op without a store tier; the count of agents loaded.
  static Result<size_t> RememberStoredAgents(const ServedModel& model, agent::AgentManager& agents);
};

}  // namespace agentkv::api
