// AgentStore: opening, agents, history and models. KV blocks are in
// agent_store_kv.cc, verify/compact/summaries in agent_store_maintenance.cc.
#include "store/agent_store.h"

#include <chrono>
#include <limits>

#include "store/record_envelope.h"
#include "store/worker_pool.h"

namespace agentkv::store {
namespace {

constexpr int kStoreFormat = 1;
constexpr std::string_view kFormatKey = "format";

}  // namespace

Result<std::unique_ptr<AgentStore>> AgentStore::Open(const std::string& dir, StoreOptions options) {
  std::unique_ptr<AgentStore> s(new AgentStore());
  LmdbOptions lo;
  lo.initial_map_bytes = options.initial_map_bytes;
  lo.max_map_bytes = std::max(options.max_map_bytes, options.initial_map_bytes);
  lo.read_only = options.read_only;
  lo.sync = options.sync;
  ASSIGN_OR_RETURN(s->env_, LmdbEnv::Open(dir, lo));
  s->options_ = std::move(options);
  s->committer_ = std::make_unique<GroupCommitter>(s->env_.get());

  // The format marker: refuse stores written by a newer build.
  {
    ASSIGN_OR_RETURN(auto r, s->env_->BeginRead());
    ASSIGN_OR_RETURN(auto v, r.Get(Db::kMeta, kFormatKey));
    if (v) {
      ASSIGN_OR_RETURN(std::string text, DecodeJsonRecord(static_cast<int>(RecordType::kStoreMeta),
                                                          *v, "meta format"));
      auto j = nlohmann::json::parse(text, nullptr, false);
      if (!j.is_object() || !j["store_format"].is_number_integer()) {
        return Corruption("meta format: no store_format");
      }
      if (j["store_format"].get<int>() > kStoreFormat) {
        return Unimplemented("store " + dir + " has format " +
                             std::to_string(j["store_format"].get<int>()) +
                             "; this build reads format " + std::to_string(kStoreFormat));
      }
    }
  }
  if (!s->options_.read_only) {
    RETURN_IF_ERROR(s->env_->Write([](LmdbEnv::WriteTxn& t) -> Status {
      ASSIGN_OR_RETURN(auto v, t.Get(Db::kMeta, kFormatKey));
      if (v) return Status::Ok();
      nlohmann::json j = {{"store_format", kStoreFormat}};
      return t.Put(Db::kMeta, kFormatKey, SealRecord(RecordType::kStoreMeta, j.dump()));
    }));
  }
  s->pool_ = std::make_unique<WorkerPool>(std::max(0, s->options_.worker_threads - 1));
  // KV write-behind compresses at low priority: under load the cores go to
  // the engine and the HTTP threads first, and the cache catches up after.
  s->write_pool_ = std::make_unique<WorkerPool>(std::max(0, s->options_.worker_threads - 1),
                                                s->options_.write_nice);
  if (!s->options_.read_only) {
    s->queue_ = std::make_unique<KvWriteQueue>(s->options_.kv_queue_max_bytes);
    s->writer_ = std::thread([p = s.get()] { p->WriterLoop(); });
  }
  return s;
}

AgentStore::~AgentStore() {
  if (queue_) {
    queue_->Close();  // the writer drains what is queued, then exits
    if (writer_.joinable()) writer_.join();
  }
}

int64_t AgentStore::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// Meta for `id` inside `t`, rebuilt from the history when the stored meta is
// corrupt (so one bad record does not lock an agent out of new turns).
Result<std::optional<AgentMeta>> LoadMetaForUpdate(LmdbTxnBase& t, std::string_view id,
                                                   int64_t now) {
  ASSIGN_OR_RETURN(auto v, t.Get(Db::kAgents, id));
  if (v) {
    auto m = DecodeAgentMeta(id, *v);
    if (m.ok()) return std::optional<AgentMeta>(std::move(*m));
    if (m.status().code() != StatusCode::kCorruption) return m.status();
  }
  uint32_t last = 0;
  const std::string prefix = HistoryPrefix(id);
  RETURN_IF_ERROR(
      t.Scan(Db::kHistory, prefix, [&](std::string_view key, std::string_view) -> Result<bool> {
        if (key.size() == prefix.size() + 4) {
          uint32_t n = 0;
          for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<uint8_t>(key[prefix.size() + i]);
          last = std::max(last, n);
        }
        return true;
      }));
  if (!v && last == 0) return std::optional<AgentMeta>();
  AgentMeta m;
  m.id = std::string(id);
  m.created_ms = now;
  m.turns = last;
  return std::optional<AgentMeta>(std::move(m));
}

}  // namespace

Result<uint32_t> AgentStore::AppendTurn(std::string_view agent_id, std::string_view messages_json,
                                        std::string_view system_prompt_hash) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  if (!nlohmann::json::accept(messages_json)) {
    return InvalidArgument("turn messages are not valid JSON");
  }
  const std::string value = SealRecord(RecordType::kTurn, messages_json);
  uint32_t turn = 0;
  bool created = false;
  auto op = [&](LmdbEnv::WriteTxn& t) -> Status {
    const int64_t now = Now();
    ASSIGN_OR_RETURN(auto existing, LoadMetaForUpdate(t, agent_id, now));
    AgentMeta m;
    created = !existing;
    if (existing) {
      m = std::move(*existing);
    } else {
      m.id = std::string(agent_id);
      m.created_ms = now;
      m.system_prompt_hash = std::string(system_prompt_hash);
    }
    m.turns += 1;
    m.last_used_ms = now;
    turn = m.turns;
    RETURN_IF_ERROR(t.Put(Db::kHistory, HistoryKey(agent_id, turn), value));
    return t.Put(Db::kAgents, agent_id, EncodeAgentMeta(m));
  };
  // Concurrent turns of other agents share the transaction and its fsync.
  Status s = committer_->Commit(op);
  if (s.code() == StatusCode::kResourceExhausted && !options_.read_only) {
    // History is data and KV a cache: make room from the KV and try once more.
    auto evicted = EvictLru(4 * value.size() + (1u << 20));
    if (evicted.ok() && *evicted > 0) s = committer_->Commit(op);
  }
  if (!s.ok()) return s.WithContext("append turn for agent " + std::string(agent_id));
  // A removed id used again is a new agent: its KV is written again.
  if (created) ClearTombstone(agent_id);
  return turn;
}

Status AgentStore::PutAgentExtras(std::string_view agent_id, const nlohmann::json& extras) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  if (!extras.is_object()) return InvalidArgument("agent extras must be a JSON object");
  return env_->Write([&](LmdbEnv::WriteTxn& t) -> Status {
    ASSIGN_OR_RETURN(auto existing, LoadMetaForUpdate(t, agent_id, Now()));
    if (!existing) return NotFound("no agent " + std::string(agent_id));
    existing->extras = extras;
    return t.Put(Db::kAgents, agent_id, EncodeAgentMeta(*existing));
  });
}

Result<AgentMeta> AgentStore::GetAgent(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  ASSIGN_OR_RETURN(auto v, r.Get(Db::kAgents, agent_id));
  if (!v) return NotFound("no agent " + std::string(agent_id));
  return DecodeAgentMeta(agent_id, *v);
}

Result<std::vector<AgentMeta>> AgentStore::ListAgents() {
  return ListAgents({}, std::numeric_limits<size_t>::max());
}

Result<std::vector<AgentMeta>> AgentStore::ListAgents(std::string_view after, size_t limit,
                                                      std::string_view prefix) {
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  std::vector<AgentMeta> out;
  if (limit == 0) return out;
  // Scan needs a start inside the prefix.
  if (after.substr(0, prefix.size()) != prefix) {
    if (after > prefix) return out;  // past every id with the prefix
    after = {};
  }
  RETURN_IF_ERROR(r.Scan(
      Db::kAgents, prefix,
      [&](std::string_view k, std::string_view v) -> Result<bool> {
        if (!after.empty() && k == after) return true;  // the cursor itself
        // A listing with a corrupt agent still lists the others; the caller
        // that needs to know runs Verify().
        auto m = DecodeAgentMeta(k, v);
        if (m.ok()) out.push_back(std::move(*m));
        return out.size() < limit;
      },
      after));
  return out;
}

Result<std::vector<Turn>> AgentStore::GetHistory(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  const std::string prefix = HistoryPrefix(agent_id);
  std::vector<Turn> out;
  RETURN_IF_ERROR(
      r.Scan(Db::kHistory, prefix, [&](std::string_view k, std::string_view v) -> Result<bool> {
        const std::string where = DescribeKey(static_cast<int>(Db::kHistory), k);
        if (k.size() != prefix.size() + 4) return Corruption(where + ": malformed key");
        Turn t;
        for (int i = 0; i < 4; ++i)
          t.number = (t.number << 8) | static_cast<uint8_t>(k[prefix.size() + i]);
        ASSIGN_OR_RETURN(t.messages_json,
                         DecodeJsonRecord(static_cast<int>(RecordType::kTurn), v, where));
        out.push_back(std::move(t));
        return true;
      }));
  if (out.empty()) {
    ASSIGN_OR_RETURN(auto v, r.Get(Db::kAgents, agent_id));
    if (!v) return NotFound("no agent " + std::string(agent_id));
  }
  return out;
}

Status AgentStore::PutModel(const ModelFingerprint& fp, std::string_view description_json) {
  if (!nlohmann::json::accept(description_json)) {
    return InvalidArgument("model description is not valid JSON");
  }
  const std::string value = SealRecord(RecordType::kModel, description_json);
  return env_->Write([&](LmdbEnv::WriteTxn& t) { return t.Put(Db::kModels, fp.AsKey(), value); });
}

Result<std::string> AgentStore::GetModel(const ModelFingerprint& fp) {
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  ASSIGN_OR_RETURN(auto v, r.Get(Db::kModels, fp.AsKey()));
  if (!v) return NotFound("no model " + fp.Hex());
  return DecodeJsonRecord(static_cast<int>(RecordType::kModel), *v, "models " + fp.Hex());
}

uint64_t AgentStore::kv_write_yields() const { return env_->background_yields(); }

}  // namespace agentkv::store
