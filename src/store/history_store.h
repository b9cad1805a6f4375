// HistoryStore: where agents and their turn histories live, as the agent
// layer sees them. Two implementations share this contract: AgentStore
// (LMDB: durable, and also the agents' KV) and MemoryHistoryStore (bounded
// memory, for serving without a store directory).
//
// Contract: ids must pass ValidateAgentId and turns must be JSON text
// (InvalidArgument otherwise). An agent exists from its first AppendTurn
// until RemoveAgent, or until a bounded store drops it to make room (the
// durable store never drops history). GetAgent, GetHistory and RemoveAgent
// answer NotFound for an unknown agent. Listings are in id byte order.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "store/fingerprint.h"
#include "store/records.h"
#include "util/status.h"

namespace agentkv::store {

struct Turn {
  uint32_t number = 0;        // 1-based
  std::string messages_json;  // as given to AppendTurn
};

class HistoryStore {
 public:
  virtual ~HistoryStore() = default;

  // Appends one turn (the messages as JSON text) to `agent_id`'s history,
  // creating the agent on its first turn; returns the turn number.
  // `system_prompt_hash` is recorded when the agent is created.
  virtual Result<uint32_t> AppendTurn(std::string_view agent_id, std::string_view messages_json,
                                      std::string_view system_prompt_hash) = 0;
  virtual Result<AgentMeta> GetAgent(std::string_view agent_id) = 0;
  // Every agent.
  virtual Result<std::vector<AgentMeta>> ListAgents() = 0;
  // At most `limit` agents whose id starts with `prefix` and sorts after
  // `after` ("": from the first).
  virtual Result<std::vector<AgentMeta>> ListAgents(std::string_view after, size_t limit,
                                                    std::string_view prefix) = 0;
  // The agent's turns, oldest first.
  virtual Result<std::vector<Turn>> GetHistory(std::string_view agent_id) = 0;
  // The agent's history and whatever else the store keeps of it.
  virtual Status RemoveAgent(std::string_view agent_id) = 0;
  // The agent's stored KV chain under `fp` from block 0 up to the first
  // gap; empty where the store keeps no KV.
  virtual Result<std::vector<ChainEntry>> GetKvChain(std::string_view agent_id,
                                                     const ModelFingerprint& fp) = 0;
};

}  // namespace agentkv::store
