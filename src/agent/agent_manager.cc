#include "agent/agent_manager.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace agentkv::agent {

namespace {

// Bytes an agent's info costs: the entry, its id twice (map key and use
// list) and the two nodes.
size_t InfoBytes(const std::string& agent) { return 2 * agent.size() + 384; }

}  // namespace

AgentManager::AgentManager(store::AgentStore* store, AgentManagerOptions options)
    : store_(store),
      options_(options),
      memory_(store != nullptr ? nullptr
                               : std::make_unique<store::MemoryHistoryStore>(
                                     options.max_memory_history_bytes,
                                     [this](const std::string& agent) { ForgetDropped(agent); })),
      history_(store != nullptr ? static_cast<store::HistoryStore&>(*store) : *memory_),
      identifier_(options.max_known_agents, options.max_known_tokens),
      strands_(options.executor) {}

void AgentManager::ForgetDropped(const std::string& agent) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseInfo(agent);
  identifier_.Forget(agent);
}

AgentInfo& AgentManager::TouchInfo(const std::string& agent) {
  auto it = info_.find(agent);
  if (it == info_.end()) {
    info_lru_.push_front(agent);
    it = info_.emplace(agent, InfoEntry{AgentInfo{}, info_lru_.begin()}).first;
    info_bytes_ += InfoBytes(agent);
  } else {
    info_lru_.splice(info_lru_.begin(), info_lru_, it->second.lru);
  }
  while (info_bytes_ > options_.max_info_bytes && info_lru_.size() > 1) {
    EraseInfo(info_lru_.back());
  }
  return it->second.info;
}

void AgentManager::EraseInfo(const std::string& agent) {
  auto it = info_.find(agent);
  if (it == info_.end()) return;
  info_bytes_ -= InfoBytes(agent);
  info_lru_.erase(it->second.lru);
  info_.erase(it);
}

int64_t AgentManager::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

engine::CacheSource ResumeSourceOf(int64_t cached_tokens, int64_t prompt_tokens,
                                   int64_t previous_tokens, engine::CacheSource source) {
  const int64_t reusable =
      previous_tokens > 0 ? std::min(previous_tokens, prompt_tokens) : prompt_tokens;
  if (cached_tokens <= 0 || 2 * cached_tokens < reusable) return engine::CacheSource::kNone;
  return source;
}

std::shared_ptr<AgentTurn> AgentManager::NewTurn(std::string agent_id, PrepareFn prepare) {
  return std::make_shared<AgentTurn>(this, std::move(agent_id), std::move(prepare));
}

Result<uint32_t> AgentManager::Record(const std::string& agent, const std::string& messages_json,
                                      const std::string& system_hash) {
  ASSIGN_OR_RETURN(const uint32_t n, history_.AppendTurn(agent, messages_json, system_hash));
  std::lock_guard<std::mutex> lock(mu_);
  AgentInfo& info = TouchInfo(agent);
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
                                std::span<const int32_t> generated,
                                const engine::RequestOutput& finished) {
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  const int64_t total = static_cast<int64_t>(tokens.size());
  identifier_.Remember(agent, std::move(tokens));
  std::lock_guard<std::mutex> lock(mu_);
  AgentInfo& info = TouchInfo(agent);
  if (info.id.empty()) info.id = agent;
  info.last_prompt_tokens = finished.prompt_tokens;
  info.last_cached_tokens = finished.cached_tokens;
  engine::CacheSource src = finished.cache_source;
  if (src == engine::CacheSource::kNone && finished.cached_tokens > 0)
    src = engine::CacheSource::kResident;
  info.last_cache_source = src;
  const int64_t previous = info.resident_tokens;
  info.resident_tokens = total;
  if (info.turns > 1) {  // a resume: where did the agent's context come from?
    switch (ResumeSourceOf(finished.cached_tokens, finished.prompt_tokens, previous, src)) {
      case engine::CacheSource::kResident:
        ++counts_.resident;
        break;
      case engine::CacheSource::kHost:
        ++counts_.host;
        break;
      case engine::CacheSource::kDisk:
        ++counts_.disk;
        break;
      case engine::CacheSource::kNone:
        ++counts_.recompute;
        break;
    }
  }
}

bool AgentManager::HasHistory(const std::string& agent) {
  Result<store::AgentMeta> meta = history_.GetAgent(agent);
  return meta.ok() || meta.status().code() != StatusCode::kNotFound;
}

Result<std::vector<std::string>> AgentManager::History(const std::string& agent) {
  ASSIGN_OR_RETURN(std::vector<store::Turn> turns, history_.GetHistory(agent));
  std::vector<std::string> out;
  out.reserve(turns.size());
  for (auto& t : turns) out.push_back(std::move(t.messages_json));
  return out;
}

void AgentManager::MergeInfo(std::map<std::string, AgentInfo>* all, const std::string& after,
                             size_t limit, const std::string& prefix) const {
  // Ids with the prefix sort together, from the prefix itself on.
  const std::string& from = after > prefix ? after : prefix;
  auto in_scope = [&](const std::string& id) { return id.compare(0, prefix.size(), prefix) == 0; };
  auto infos = from.empty() ? info_.begin() : info_.upper_bound(from);
  if (from == prefix && !prefix.empty()) infos = info_.lower_bound(prefix);
  for (size_t n = 0; infos != info_.end() && n < limit && in_scope(infos->first); ++infos, ++n) {
    AgentInfo& a = (*all)[infos->first];
    const AgentInfo stored = a;
    a = infos->second.info;
    a.id = infos->first;
    if (!stored.id.empty()) {  // the store's count and times win
      a.turns = stored.turns;
      a.created_ms = stored.created_ms;
      a.last_used_ms = stored.last_used_ms;
    }
  }
}

Result<std::vector<AgentInfo>> AgentManager::List() {
  ASSIGN_OR_RETURN(AgentPage page, List("", std::numeric_limits<size_t>::max() - 1));
  return std::move(page.agents);
}

Result<AgentPage> AgentManager::List(const std::string& after, size_t limit,
                                     const std::string& prefix) {
  // One more than asked, from each source: whether more follow.
  const size_t want = limit + 1;
  std::map<std::string, AgentInfo> all;
  ASSIGN_OR_RETURN(std::vector<store::AgentMeta> metas, history_.ListAgents(after, want, prefix));
  for (const auto& m : metas) {
    AgentInfo& a = all[m.id];
    a.id = m.id;
    a.turns = m.turns;
    a.created_ms = m.created_ms;
    a.last_used_ms = m.last_used_ms;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    MergeInfo(&all, after, want, prefix);
  }
  AgentPage page;
  page.has_more = all.size() > limit;
  page.agents.reserve(std::min(all.size(), limit));
  for (auto& [id, a] : all) {
    if (page.agents.size() == limit) break;
    a.pending = strands_.Pending(id);
    page.agents.push_back(std::move(a));
  }
  return page;
}

Result<AgentInfo> AgentManager::Get(const std::string& agent) {
  AgentInfo a;
  bool known = false;
  auto meta = history_.GetAgent(agent);
  if (meta.ok()) {
    known = true;
    a.id = agent;
    a.turns = meta->turns;
    a.created_ms = meta->created_ms;
    a.last_used_ms = meta->last_used_ms;
  } else if (meta.status().code() != StatusCode::kNotFound) {
    return meta.status();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = info_.find(agent);
    if (it != info_.end()) {
      const AgentInfo stored = a;
      a = it->second.info;
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
      known = info_.count(agent) > 0;
      EraseInfo(agent);
    }
    identifier_.Forget(agent);
    if (drop_kv) drop_kv();
    Status s;
    auto meta = history_.GetAgent(agent);
    if (meta.ok()) {
      known = true;
      s = history_.RemoveAgent(agent);
    } else if (meta.status().code() != StatusCode::kNotFound) {
      s = meta.status();
    }
    if (s.ok() && !known) s = NotFound("no agent '" + agent + "'");
    strands_.Done(agent);
    if (done) done(s);
  });
}

void AgentManager::ForgetResident() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : info_) e.info.resident_tokens = 0;
}

Result<size_t> AgentManager::RememberStoredChains(const store::ModelFingerprint& kv_fp) {
  identifier_.ForgetAll();
  ASSIGN_OR_RETURN(std::vector<store::AgentMeta> metas, history_.ListAgents());
  std::sort(metas.begin(), metas.end(),
            [](const auto& a, const auto& b) { return a.last_used_ms > b.last_used_ms; });
  if (metas.size() > identifier_.capacity()) metas.resize(identifier_.capacity());
  size_t loaded = 0;
  // Oldest first, so the most recent are remembered last (ties go to them).
  for (auto it = metas.rbegin(); it != metas.rend(); ++it) {
    ASSIGN_OR_RETURN(std::vector<store::ChainEntry> chain, history_.GetKvChain(it->id, kv_fp));
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
