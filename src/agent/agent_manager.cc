#include "agent/agent_manager.h"

#include <algorithm>
#include <chrono>

namespace agentkv::agent {

AgentManager::AgentManager(store::AgentStore* store) : store_(store) {}

int64_t AgentManager::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<AgentTurn> AgentManager::NewTurn(std::string agent_id, PrepareFn prepare) {
  return std::make_shared<AgentTurn>(this, std::move(agent_id), std::move(prepare));
}

Result<uint32_t> AgentManager::Record(const std::string& agent, const std::string& messages_json,
                                      const std::string& system_hash) {
  uint32_t n = 0;
  if (store_ != nullptr) {
    ASSIGN_OR_RETURN(n, store_->AppendTurn(agent, messages_json, system_hash));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (store_ == nullptr) {
    auto& turns = memory_[agent];
    turns.push_back(messages_json);
    n = static_cast<uint32_t>(turns.size());
  }
  AgentInfo& info = info_[agent];
  const int64_t now = NowMs();
  if (info.id.empty()) {
    info.id = agent;
    info.created_ms = now;
  }
  info.turns = n;
  info.last_used_ms = now;
  return n;
}

void AgentManager::NoteFinished(const std::string& agent, const std::vector<int32_t>& prompt,
                                std::span<const int32_t> generated, const RequestOutput& finished) {
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  const int64_t total = static_cast<int64_t>(tokens.size());
  identifier_.Remember(agent, std::move(tokens));
  std::lock_guard<std::mutex> lock(mu_);
  AgentInfo& info = info_[agent];
  info.last_prompt_tokens = finished.prompt_tokens;
  info.last_cached_tokens = finished.cached_tokens;
  CacheSource src = finished.cache_source;
  if (src == CacheSource::kNone && finished.cached_tokens > 0) src = CacheSource::kResident;
  info.last_cache_source = src;
  info.resident_tokens = total;
  if (info.turns > 1) {  // a resume: where did the agent's context come from?
    switch (finished.cached_tokens > 0 ? src : CacheSource::kNone) {
      case CacheSource::kResident:
        ++counts_.resident;
        break;
      case CacheSource::kHost:
        ++counts_.host;
        break;
      case CacheSource::kDisk:
        ++counts_.disk;
        break;
      case CacheSource::kNone:
        ++counts_.recompute;
        break;
    }
  }
}

Result<std::vector<std::string>> AgentManager::History(const std::string& agent) {
  if (store_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<store::Turn> turns, store_->GetHistory(agent));
    if (turns.empty()) {
      auto meta = store_->GetAgent(agent);
      if (!meta.ok()) return meta.status();
    }
    std::vector<std::string> out;
    out.reserve(turns.size());
    for (auto& t : turns) out.push_back(std::move(t.messages_json));
    return out;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = memory_.find(agent);
  if (it == memory_.end()) return NotFound("no agent '" + agent + "'");
  return it->second;
}

Result<std::vector<AgentInfo>> AgentManager::List() {
  std::map<std::string, AgentInfo> all;
  if (store_ != nullptr) {
    ASSIGN_OR_RETURN(std::vector<store::AgentMeta> metas, store_->ListAgents());
    for (const auto& m : metas) {
      AgentInfo& a = all[m.id];
      a.id = m.id;
      a.turns = m.turns;
      a.created_ms = m.created_ms;
      a.last_used_ms = m.last_used_ms;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, info] : info_) {
    AgentInfo& a = all[id];
    const AgentInfo stored = a;
    a = info;
    if (store_ != nullptr && !stored.id.empty()) {
      a.turns = stored.turns;
      a.created_ms = stored.created_ms;
      a.last_used_ms = stored.last_used_ms;
    }
  }
  std::vector<AgentInfo> out;
  out.reserve(all.size());
  for (auto& [id, a] : all) {
    a.pending = strands_.Pending(id);
    out.push_back(std::move(a));
  }
  return out;
}

Result<AgentInfo> AgentManager::Get(const std::string& agent) {
  AgentInfo a;
  bool known = false;
  if (store_ != nullptr) {
    auto meta = store_->GetAgent(agent);
    if (meta.ok()) {
      known = true;
      a.id = agent;
      a.turns = meta->turns;
      a.created_ms = meta->created_ms;
      a.last_used_ms = meta->last_used_ms;
    } else if (meta.status().code() != StatusCode::kNotFound) {
      return meta.status();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = info_.find(agent);
    if (it != info_.end()) {
      const AgentInfo stored = a;
      a = it->second;
      if (known) {
        a.turns = stored.turns;
        a.created_ms = stored.created_ms;
        a.last_used_ms = stored.last_used_ms;
      }
      known = true;
    }
  }
  if (!known) return NotFound("no agent '" + agent + "'");
  a.pending = strands_.Pending(agent);
  return a;
}

void AgentManager::Delete(const std::string& agent, std::function<void()> drop_kv,
                          std::function<void(Status)> done) {
  strands_.Post(agent, [this, agent, drop_kv = std::move(drop_kv), done = std::move(done)] {
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = info_.erase(agent) > 0;
      known = memory_.erase(agent) > 0 || known;
    }
    identifier_.Forget(agent);
    if (drop_kv) drop_kv();
    Status s;
    if (store_ != nullptr) {
      auto meta = store_->GetAgent(agent);
      if (meta.ok()) {
        known = true;
        s = store_->RemoveAgent(agent);
      } else if (meta.status().code() != StatusCode::kNotFound) {
        s = meta.status();
      }
    }
    if (s.ok() && !known) s = NotFound("no agent '" + agent + "'");
    strands_.Done(agent);
    if (done) done(s);
  });
}

void AgentManager::ForgetResident() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, info] : info_) info.resident_tokens = 0;
}

Result<size_t> AgentManager::RememberStoredChains(const store::ModelFingerprint& kv_fp) {
  identifier_.ForgetAll();
  if (store_ == nullptr) return size_t{0};
  ASSIGN_OR_RETURN(std::vector<store::AgentMeta> metas, store_->ListAgents());
  std::sort(metas.begin(), metas.end(),
            [](const auto& a, const auto& b) { return a.last_used_ms > b.last_used_ms; });
  if (metas.size() > identifier_.capacity()) metas.resize(identifier_.capacity());
  size_t loaded = 0;
  // Oldest first, so the most recent are remembered last (ties go to them).
  for (auto it = metas.rbegin(); it != metas.rend(); ++it) {
    ASSIGN_OR_RETURN(std::vector<store::ChainEntry> chain, store_->GetKvChain(it->id, kv_fp));
    if (chain.empty()) continue;
    std::vector<int32_t> tokens;
    for (const auto& e : chain) tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
    identifier_.Remember(it->id, std::move(tokens));
    ++loaded;
  }
  return loaded;
}

ResumeCounts AgentManager::resume_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace agentkv::agent
