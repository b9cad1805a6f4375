// AgentManager: the agent layer's entry point. It identifies agents
// (AgentIdentifier), orders each agent's turns (AgentStrands), keeps the
// history in a HistoryStore (the AgentStore when there is one, durable on
// every turn; otherwise a MemoryHistoryStore of its own) and what is known
// of each agent's cache (where its last turn's prompt came from, how many
// tokens it left resident), and counts where resumed prompts came from
// (resident, host, disk, recompute).
//
// The manager knows nothing of HTTP or of which model is served: turns get
// their engine from the protocol layer's PrepareFn, and Delete is handed the
// function that drops the agent's resident KV.
//
// Memory: what it keeps is bounded (AgentManagerOptions).
//
// Thread-safety: every method may be called from any thread. Borrows the
// store (may be null), which must outlive the manager; the manager must
// outlive every AgentTurn it made. Lock order: the history store's lock,
// then the manager's (a MemoryHistoryStore reports dropped agents under
// its lock), never the reverse.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/agent_identifier.h"
#include "agent/agent_strands.h"
#include "agent/agent_turn.h"
#include "engine/request.h"
#include "store/agent_store.h"
#include "store/history_store.h"
#include "store/memory_history_store.h"

namespace agentkv::agent {

// What the manager knows of an agent.
struct AgentInfo {
  std::string id;
  uint32_t turns = 0;
  int64_t created_ms = 0;
  int64_t last_used_ms = 0;
  // The agent's last turn (in this process): prompt and cached prompt
  // tokens, where the cached ones came from, and the tokens it left
  // resident in the engine (prompt + generated) unless evicted since.
  int64_t last_prompt_tokens = 0;
  int64_t last_cached_tokens = 0;
  engine::CacheSource last_cache_source = engine::CacheSource::kNone;
  int64_t resident_tokens = 0;
  // Turns queued or running now.
  size_t pending = 0;
};

struct ResumeCounts {
  int64_t resident = 0;   // the agent's context came from the pool
  int64_t host = 0;       // ... from host memory
  int64_t disk = 0;       // ... from the store
  int64_t recompute = 0;  // little or nothing cached: prefilled from the history
};

// Where a resumed agent's context came from, for ResumeCounts: `source`
// (the tier that served the cached tokens) when they cover at least half
// of what the agent could have reused, the shorter of its previous context
// (`previous_tokens`, prompt + reply of its last turn; 0 when unknown) and
// this prompt; otherwise kNone (recomputed). A prompt that found only a
// prefix it shares with other agents, such as a common system prompt, was
// recomputed: counting it by that prefix's tier would report an agent
// re-prefilled after a restart as resident. Pure.
engine::CacheSource ResumeSourceOf(int64_t cached_tokens, int64_t prompt_tokens,
                                   int64_t previous_tokens, engine::CacheSource source);

// Bounds on what the manager keeps in memory (each least recently used
// first out past its bound).
struct AgentManagerOptions {
  // Runtime knowledge of agents (AgentInfo: last turn's cache use, resident
  // tokens), about 300 bytes an agent. Past it, the least recently used
  // agent's is forgotten; the agent itself stays listed by its history.
  size_t max_info_bytes = 32ull << 20;
  // Without a store: the histories kept in memory (MemoryHistoryStore).
  // Past it, the least recently used agent's whole history is dropped, and
  // all that is known of it (the agent is gone, as after a restart); the
  // agent whose turn is being recorded never is.
  size_t max_memory_history_bytes = 512ull << 20;
  // Content matching (AgentIdentifier): agents and tokens remembered.
  size_t max_known_agents = 4096;
  size_t max_known_tokens = 32ull << 20;
  // Where agents' tasks start (AgentStrands' executor): a worker pool, so
  // rendering, tokenizing and the store's waits stay off the callers'
  // threads. Null: inline. It must run every task posted while the manager
  // lives (stop the pool before destroying the manager).
  AgentStrands::Executor executor;
};

// One page of agents, by id (byte order).
struct AgentPage {
  std::vector<AgentInfo> agents;
  bool has_more = false;  // agents follow the last one
};

class AgentManager {
 public:
  // `store`: the durable store, or null to keep histories in memory
  // (bounded by options.max_memory_history_bytes).
  explicit AgentManager(store::AgentStore* store, AgentManagerOptions options = {});

  AgentIdentifier& identifier() { return identifier_; }
  AgentStrands& strands() { return strands_; }
  // The durable store, or null (histories in memory).
  store::AgentStore* store() const { return store_; }

  // A turn of `agent_id`, not started yet (AgentTurn::Start).
  std::shared_ptr<AgentTurn> NewTurn(std::string agent_id, PrepareFn prepare);

  // The agent's turns' messages JSON text, oldest first. NotFound for an
  // unknown agent.
  Result<std::vector<std::string>> History(const std::string& agent);
  // Every agent (store agents and in-memory ones), by id.
  Result<std::vector<AgentInfo>> List();
  // At most `limit` agents whose id starts with `prefix` (one tenant's) and
  // sorts after `after` ("" : from the first), by id. Reads only that much
  // of the store.
  Result<AgentPage> List(const std::string& after, size_t limit, const std::string& prefix = "");
  // One agent; NotFound if unknown.
  Result<AgentInfo> Get(const std::string& agent);

  // Runs on the agent's strand after every turn queued before it:
  // `drop_kv` (forget the resident KV), then removes history and stored KV,
  // then `done` with the result (NotFound for an unknown agent).
  void Delete(const std::string& agent, std::function<void()> drop_kv,
              std::function<void(Status)> done);

  // Forgets what is known of every agent's resident KV (the engine was
  // replaced: model hot-swap, restart).
  void ForgetResident();

  // Content matching after a restart or a model swap: replaces the
  // remembered token sequences with the stored KV chains (their tokens)
  // under `kv_fp`, the served model's KV fingerprint, of the most recently
  // used agents (at most the identifier's capacity). Returns how many agents
  // were loaded; store errors end the scan early (reported).
  Result<size_t> RememberStoredChains(const store::ModelFingerprint& kv_fp);

  ResumeCounts resume_counts() const;

 private:
  friend class AgentTurn;
  // Appends a turn; returns its number.
  Result<uint32_t> Record(const std::string& agent, const std::string& messages_json,
                          const std::string& system_hash);
  void NoteFinished(const std::string& agent, const std::vector<int32_t>& prompt,
                    std::span<const int32_t> generated, const engine::RequestOutput& finished);
  // Whether the agent has a recorded turn (true too when the store cannot
  // tell).
  bool HasHistory(const std::string& agent);
  int64_t NowMs() const;
  // Under mu_: `agent`'s info, created if absent, made the most recently
  // used; other agents' infos past the byte bound are forgotten.
  AgentInfo& TouchInfo(const std::string& agent);
  void EraseInfo(const std::string& agent);
  // Under mu_: the infos in the page merged over the stored agents `all`.
  void MergeInfo(std::map<std::string, AgentInfo>* all, const std::string& after, size_t limit,
                 const std::string& prefix) const;
  // The history store dropped `agent` to make room: forget it everywhere.
  void ForgetDropped(const std::string& agent);

  store::AgentStore* store_;
  const AgentManagerOptions options_;
  // Without a durable store, the histories in memory.
  std::unique_ptr<store::MemoryHistoryStore> memory_;
  store::HistoryStore& history_;
  AgentIdentifier identifier_;
  AgentStrands strands_;

  mutable std::mutex mu_;
  // Runtime knowledge, and its use order (most recent first).
  struct InfoEntry {
    AgentInfo info;
    std::list<std::string>::iterator lru;
  };
  std::map<std::string, InfoEntry> info_;
  std::list<std::string> info_lru_;
  size_t info_bytes_ = 0;
  ResumeCounts counts_;
};

}  // namespace agentkv::agent
