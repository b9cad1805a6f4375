#include "store/memory_history_store.h"

#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>

namespace agentkv::store {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status NoAgent(std::string_view agent_id) { return NotFound("no agent " + std::string(agent_id)); }

}  // namespace

MemoryHistoryStore::MemoryHistoryStore(size_t max_bytes, DropFn on_drop)
    : max_bytes_(max_bytes), on_drop_(std::move(on_drop)) {}

size_t MemoryHistoryStore::AgentBytes(std::string_view agent_id,
                                      std::string_view system_prompt_hash) {
  return agent_id.size() + system_prompt_hash.size() + 32;
}

size_t MemoryHistoryStore::TurnBytes(std::string_view messages_json) {
  return messages_json.size() + 32;
}

size_t MemoryHistoryStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void MemoryHistoryStore::EraseLocked(Map::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  agents_.erase(it);
}

Result<uint32_t> MemoryHistoryStore::AppendTurn(std::string_view agent_id,
                                                std::string_view messages_json,
                                                std::string_view system_prompt_hash) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  if (!nlohmann::json::accept(messages_json)) {
    return InvalidArgument("turn messages are not valid JSON");
  }
  const int64_t now = NowMs();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) {
    lru_.emplace_front(agent_id);
    Entry e;
    e.meta.id = std::string(agent_id);
    e.meta.created_ms = now;
    e.meta.system_prompt_hash = std::string(system_prompt_hash);
    e.bytes = AgentBytes(agent_id, system_prompt_hash);
    e.lru = lru_.begin();
    bytes_ += e.bytes;
    it = agents_.emplace(std::string(agent_id), std::move(e)).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Entry& e = it->second;
  e.turns.emplace_back(messages_json);
  e.bytes += TurnBytes(messages_json);
  bytes_ += TurnBytes(messages_json);
  e.meta.turns = static_cast<uint32_t>(e.turns.size());
  e.meta.last_used_ms = now;
  const uint32_t turn = e.meta.turns;
  // Other agents make room, least recently appended to first.
  while (bytes_ > max_bytes_ && lru_.size() > 1) {
    const std::string victim = lru_.back();
    EraseLocked(agents_.find(victim));
    if (on_drop_) on_drop_(victim);
  }
  return turn;
}

Result<AgentMeta> MemoryHistoryStore::GetAgent(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return NoAgent(agent_id);
  return it->second.meta;
}

Result<std::vector<AgentMeta>> MemoryHistoryStore::ListAgents() {
  return ListAgents({}, std::numeric_limits<size_t>::max(), {});
}

Result<std::vector<AgentMeta>> MemoryHistoryStore::ListAgents(std::string_view after, size_t limit,
                                                              std::string_view prefix) {
  std::vector<AgentMeta> out;
  if (limit == 0) return out;
  // A cursor outside the prefix: before its ids (from the first) or past
  // them all.
  if (after.substr(0, prefix.size()) != prefix) {
    if (after > prefix) return out;
    after = {};
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = after.empty() ? agents_.lower_bound(prefix) : agents_.upper_bound(after);
  for (; it != agents_.end() && out.size() < limit; ++it) {
    if (std::string_view(it->first).substr(0, prefix.size()) != prefix) break;
    out.push_back(it->second.meta);
  }
  return out;
}

Result<std::vector<Turn>> MemoryHistoryStore::GetHistory(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return NoAgent(agent_id);
  std::vector<Turn> out;
  out.reserve(it->second.turns.size());
  for (size_t i = 0; i < it->second.turns.size(); ++i) {
    out.push_back(Turn{static_cast<uint32_t>(i + 1), it->second.turns[i]});
  }
  return out;
}

Status MemoryHistoryStore::RemoveAgent(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return NoAgent(agent_id);
  EraseLocked(it);
  return Status::Ok();
}

Result<std::vector<ChainEntry>> MemoryHistoryStore::GetKvChain(std::string_view agent_id,
                                                               const ModelFingerprint&) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  return std::vector<ChainEntry>{};
}

}  // namespace agentkv::store
