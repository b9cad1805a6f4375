// MemoryHistoryStore: agents' histories in memory, for serving without a
// store directory (--store none). Nothing survives the process; no KV is
// kept (GetKvChain is always empty).
//
// Bounded: past `max_bytes` (--history-memory), AppendTurn drops other
// agents whole, least recently appended to first, each as if removed; the
// agent being appended to is never dropped, so one agent alone may exceed
// the bound. `on_drop` hears of each dropped agent so that what others know
// of it can go too. Reads do not count as use.
//
// Thread-safety: every method may be called from any thread. `on_drop`
// runs inside AppendTurn under the store's lock: it must not call back
// into the store.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "store/history_store.h"

namespace agentkv::store {

class MemoryHistoryStore : public HistoryStore {
 public:
  using DropFn = std::function<void(const std::string& agent_id)>;
  explicit MemoryHistoryStore(size_t max_bytes, DropFn on_drop = {});

  Result<uint32_t> AppendTurn(std::string_view agent_id, std::string_view messages_json,
                              std::string_view system_prompt_hash) override;
  Result<AgentMeta> GetAgent(std::string_view agent_id) override;
  Result<std::vector<AgentMeta>> ListAgents() override;
  Result<std::vector<AgentMeta>> ListAgents(std::string_view after, size_t limit,
                                            std::string_view prefix) override;
  Result<std::vector<Turn>> GetHistory(std::string_view agent_id) override;
  Status RemoveAgent(std::string_view agent_id) override;
  Result<std::vector<ChainEntry>> GetKvChain(std::string_view agent_id,
                                             const ModelFingerprint& fp) override;

  // What the bound counts: each agent's id and system prompt hash, each
  // turn's text, and a fixed overhead per agent and per turn.
  size_t bytes() const;
  size_t max_bytes() const { return max_bytes_; }
  static size_t AgentBytes(std::string_view agent_id, std::string_view system_prompt_hash);
  static size_t TurnBytes(std::string_view messages_json);

 private:
  struct Entry {
    AgentMeta meta;
    std::vector<std::string> turns;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  using Map = std::map<std::string, Entry, std::less<>>;
  // Under mu_: forgets `it` and its bytes.
  void EraseLocked(Map::iterator it);

  const size_t max_bytes_;
  const DropFn on_drop_;
  mutable std::mutex mu_;
  Map agents_;
  std::list<std::string> lru_;  // most recently appended to first
  size_t bytes_ = 0;
};

}  // namespace agentkv::store
