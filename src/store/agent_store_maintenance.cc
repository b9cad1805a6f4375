// AgentStore: removal, summaries, verification and compaction.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "store/agent_store.h"
#include "store/kv_block_codec.h"
#include "store/record_envelope.h"
#include "store/worker_pool.h"

namespace agentkv::store {
namespace {

Result<KvMeta> MetaOrEmpty(LmdbTxnBase& t, const std::string& key) {
  ASSIGN_OR_RETURN(auto v, t.Get(Db::kKvMeta, key));
  if (!v) return KvMeta{};
  auto m = DecodeKvMeta(*v, "");
  return m.ok() ? *m : KvMeta{};
}

Status FsyncPath(const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDWR) | O_CLOEXEC);
  if (fd < 0) return LmdbStatus(errno, "open " + path);
  int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return LmdbStatus(rc, "fsync " + path);
}

}  // namespace

Result<AgentStore::ChainRemoval> AgentStore::RemoveChainsIn(LmdbEnv::WriteTxn& t,
                                                            std::string_view agent_id) {
  ChainRemoval out;
  std::vector<std::string> chains;
  std::vector<std::string> kv_refs;  // KV keys the chains name
  RETURN_IF_ERROR(t.Scan(Db::kChains, ChainPrefix(agent_id),
                         [&](std::string_view k, std::string_view v) -> Result<bool> {
                           chains.emplace_back(k);
                           ModelFingerprint fp;
                           uint32_t index;
                           auto e = DecodeChainEntry(v, "");
                           if (e.ok() && ParseChainKey(k, agent_id.size(), &fp, &index)) {
                             kv_refs.push_back(KvKey(fp, e->hash));
                           }
                           return true;
                         }));
  for (const auto& k : chains) RETURN_IF_ERROR(t.Del(Db::kChains, k).status());
  for (const auto& key : kv_refs) {
    ASSIGN_OR_RETURN(KvMeta m, MetaOrEmpty(t, key));
    if (m.refcount > 1) {
      m.refcount -= 1;
      RETURN_IF_ERROR(t.Put(Db::kKvMeta, key, EncodeKvMeta(m)));
      continue;
    }
    // No other chain names it: the block was this agent's alone.
    ASSIGN_OR_RETURN(bool existed, t.Del(Db::kKv, key));
    out.blocks += existed ? 1 : 0;
    RETURN_IF_ERROR(t.Del(Db::kKvMeta, key).status());
  }
  out.chain_entries = chains.size();
  return out;
}

Status AgentStore::RemoveAgent(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  // The tombstone first: the writer drops this agent's queued writes and
  // PutKvBlocks refuses new ones (saves still in flight elsewhere). Then
  // the queue resolves, so none of its writes lands after the removal. An
  // earlier write error (of any agent) is not this removal's to report: it
  // stays for the next Flush.
  if (queue_) {
    AddTombstone(agent_id);
    queue_->WaitResolved();
  }
  Status s = env_->Write([&](LmdbEnv::WriteTxn& t) -> Status {
    std::vector<std::string> history;
    RETURN_IF_ERROR(t.Scan(Db::kHistory, HistoryPrefix(agent_id),
                           [&](std::string_view k, std::string_view) -> Result<bool> {
                             history.emplace_back(k);
                             return true;
                           }));
    ASSIGN_OR_RETURN(bool had_meta, t.Del(Db::kAgents, agent_id));
    ASSIGN_OR_RETURN(ChainRemoval removed, RemoveChainsIn(t, agent_id));
    if (!had_meta && history.empty() && removed.chain_entries == 0) {
      return NotFound("no agent " + std::string(agent_id));
    }
    for (const auto& k : history) RETURN_IF_ERROR(t.Del(Db::kHistory, k).status());
    return Status::Ok();
  });
  return s.ok() ? s : s.WithContext("remove agent " + std::string(agent_id));
}

Result<uint64_t> AgentStore::RemoveUnrecordedChains() {
  uint64_t swept = 0;
  Status s = env_->Write([&](LmdbEnv::WriteTxn& t) -> Status {
    swept = 0;
    // One agent at a time: its first chain key names it; then on to the
    // keys past all of its ("id" 0x01 sorts after every "id" 0x00 key).
    std::string from;
    while (true) {
      std::string key;
      RETURN_IF_ERROR(t.Scan(
          Db::kChains, {},
          [&](std::string_view k, std::string_view) -> Result<bool> {
            key = std::string(k);
            return false;
          },
          from));
      if (key.empty()) return Status::Ok();
      const size_t nul = key.find('\0');
      if (nul == std::string::npos || nul == 0) {
        // Malformed (no agent id): Verify's to report, not ours to guess.
        from = key + '\0';
        continue;
      }
      const std::string agent = key.substr(0, nul);
      from = agent + '\x01';
      ASSIGN_OR_RETURN(auto meta, t.Get(Db::kAgents, agent));
      if (meta) continue;
      ASSIGN_OR_RETURN(ChainRemoval r, RemoveChainsIn(t, agent));
      unrecorded_entries_removed_ += r.chain_entries;
      unrecorded_blocks_removed_ += r.blocks;
      ++swept;
    }
  });
  if (!s.ok()) return s.WithContext("remove unrecorded chains");
  return swept;
}

Result<AgentSummary> AgentStore::Summarize(std::string_view agent_id) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  ASSIGN_OR_RETURN(auto v, r.Get(Db::kAgents, agent_id));
  if (!v) return NotFound("no agent " + std::string(agent_id));
  AgentSummary out;
  ASSIGN_OR_RETURN(out.meta, DecodeAgentMeta(agent_id, *v));
  std::map<std::string, KvFingerprintUsage> per_fp;
  RETURN_IF_ERROR(r.Scan(Db::kChains, HistoryPrefix(agent_id),
                         [&](std::string_view k, std::string_view val) -> Result<bool> {
                           ModelFingerprint fp;
                           uint32_t index;
                           if (!ParseChainKey(k, agent_id.size(), &fp, &index)) return true;
                           auto& u = per_fp[std::string(fp.AsKey())];
                           u.fp = fp;
                           ++u.chain_blocks;
                           auto e = DecodeChainEntry(val, "");
                           if (!e.ok()) return true;
                           ASSIGN_OR_RETURN(KvMeta m, MetaOrEmpty(r, KvKey(fp, e->hash)));
                           if (m.stored_bytes > 0) {
                             ++u.stored_blocks;
                             u.stored_bytes += m.stored_bytes;
                           }
                           return true;
                         }));
  for (auto& [k, u] : per_fp) out.kv.push_back(u);
  return out;
}

Result<uint64_t> AgentStore::UsedBytes() {
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  return r.UsedBytes();
}

Result<VerifyReport> AgentStore::Verify() {
  VerifyReport rep;
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  auto note = [&](const Status& s) {
    if (!s.ok()) rep.problems.push_back(s.message());
  };
  auto simple = [&](Db db, auto check) -> Status {
    return r.Scan(db, {}, [&](std::string_view k, std::string_view v) -> Result<bool> {
      ++rep.records;
      note(check(k, v, DescribeKey(static_cast<int>(db), k)));
      return true;
    });
  };
  auto json_of = [](RecordType type) {
    return [type](std::string_view, std::string_view v, const std::string& where) {
      return DecodeJsonRecord(static_cast<int>(type), v, where).status();
    };
  };
  RETURN_IF_ERROR(simple(Db::kMeta, json_of(RecordType::kStoreMeta)));
  RETURN_IF_ERROR(simple(Db::kHistory, json_of(RecordType::kTurn)));
  RETURN_IF_ERROR(simple(Db::kModels, json_of(RecordType::kModel)));
  RETURN_IF_ERROR(
      simple(Db::kAgents, [](std::string_view k, std::string_view v, const std::string&) {
        return DecodeAgentMeta(k, v).status();
      }));
  RETURN_IF_ERROR(
      simple(Db::kChains, [](std::string_view, std::string_view v, const std::string& w) {
        return DecodeChainEntry(v, w).status();
      }));
  RETURN_IF_ERROR(
      simple(Db::kKvMeta, [](std::string_view, std::string_view v, const std::string& w) {
        return DecodeKvMeta(v, w).status();
      }));

  // KV blocks: parse and decompress, a batch at a time on the worker pool.
  std::vector<std::pair<std::string_view, std::string_view>> batch;
  auto run_batch = [&] {
    std::vector<Status> st(batch.size());
    std::vector<uint64_t> sizes(batch.size());
    pool_->ParallelFor(batch.size(), [&](size_t i) {
      const auto [k, v] = batch[i];
      const std::string where = DescribeKey(static_cast<int>(Db::kKv), k);
      if (k.size() != 32) {
        st[i] = Corruption(where + ": malformed key");
        return;
      }
      ModelFingerprint fp;
      std::memcpy(fp.bytes.data(), k.data(), 16);
      auto view = KvBlockCodec::Parse(v, fp, DecodeBlockHash(k.data() + 16),
                                      options_.max_block_bytes, where);
      if (!view.ok()) {
        st[i] = view.status();
        return;
      }
      std::string data;
      KvBlockCodec codec;
      st[i] = codec.Decode(*view, &data, where);
      sizes[i] = data.size();
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      ++rep.records;
      ++rep.kv_blocks;
      rep.kv_stored_bytes += batch[i].second.size();
      rep.kv_uncompressed_bytes += sizes[i];
      note(st[i]);
    }
    batch.clear();
  };
  RETURN_IF_ERROR(r.Scan(Db::kKv, {}, [&](std::string_view k, std::string_view v) -> Result<bool> {
    batch.emplace_back(k, v);
    if (batch.size() >= 64) run_batch();
    return true;
  }));
  run_batch();
  return rep;
}

Status AgentStore::Compact(const std::string& dir) {
  LmdbOptions lo;
  lo.exclusive = true;
  lo.initial_map_bytes = 1 << 20;  // LMDB adopts the file's own map size
  ASSIGN_OR_RETURN(auto env, LmdbEnv::Open(dir, lo));
  const std::string tmp = dir + "/compact.tmp";
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  std::filesystem::create_directories(tmp, ec);
  if (ec) return IoError("create " + tmp + ": " + ec.message());
  RETURN_IF_ERROR(env->CopyCompact(tmp));
  RETURN_IF_ERROR(FsyncPath(tmp + "/data.mdb", false));
  // Swapped while this process still holds store.lock exclusively; the old
  // inode goes away when the environment closes.
  if (std::rename((tmp + "/data.mdb").c_str(), (dir + "/data.mdb").c_str()) != 0) {
    return LmdbStatus(errno, "swap in compacted data file");
  }
  RETURN_IF_ERROR(FsyncPath(dir, true));
  std::filesystem::remove_all(tmp, ec);
  return Status::Ok();
}

}  // namespace agentkv::store
