// AgentStore: KV blocks. Write-behind through KvWriteQueue and one writer
// thread (group commit); resume lookups decompress on the worker pool;
// least-recently-used eviction under max_bytes.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_set>

#include "store/agent_store.h"
#include "store/kv_block_codec.h"
#include "store/record_envelope.h"
#include "store/worker_pool.h"

namespace agentkv::store {
namespace {

KvBlockCodec& ThreadCodec(int level) {
  thread_local KvBlockCodec codec;
  codec.set_level(level);
  return codec;
}

constexpr int kKvDb = static_cast<int>(Db::kKv);

// The meta of `key` for a write that changes it anyway (a block stored, a
// reference added or dropped). Bookkeeping that fails its checksum is
// rebuilt: the stored size from the KV record itself (so the block stays
// evictable), the reference count from zero; it only steers eviction and
// sharing, never what is served.
Result<KvMeta> LoadKvMetaForUpdate(LmdbTxnBase& t, const std::string& key) {
  ASSIGN_OR_RETURN(auto v, t.Get(Db::kKvMeta, key));
  if (!v) return KvMeta{};
  auto m = DecodeKvMeta(*v, DescribeKey(static_cast<int>(Db::kKvMeta), key));
  if (m.ok()) return *m;
  KvMeta rebuilt;
  ASSIGN_OR_RETURN(auto kv, t.Get(Db::kKv, key));
  if (kv) rebuilt.stored_bytes = static_cast<uint32_t>(kv->size());
  return rebuilt;
}

// Adds `delta` references to a block; a block with no references and no
// stored record loses its meta.
Status AddRef(LmdbEnv::WriteTxn& t, const std::string& key, int delta, int64_t now) {
  ASSIGN_OR_RETURN(KvMeta m, LoadKvMetaForUpdate(t, key));
  if (delta > 0) {
    m.refcount += static_cast<uint32_t>(delta);
    m.last_access_ms = static_cast<uint64_t>(now);
  } else {
    m.refcount -= std::min<uint32_t>(m.refcount, static_cast<uint32_t>(-delta));
  }
  if (m.refcount == 0 && m.stored_bytes == 0) {
    return t.Del(Db::kKvMeta, key).status();
  }
  return t.Put(Db::kKvMeta, key, EncodeKvMeta(m));
}

}  // namespace

void AgentStore::PutKvBlocks(KvChainWrite write) {
  if (!queue_) return;  // read-only
  if (!write.agent_id.empty() && IsTombstoned(write.agent_id)) {
    ++tombstoned_writes_;
    return;
  }
  queue_->Push(std::move(write));
}

bool AgentStore::IsTombstoned(std::string_view agent_id) const {
  std::lock_guard lock(tomb_mu_);
  return !tombstones_.empty() && tombstones_.count(std::string(agent_id)) > 0;
}

void AgentStore::AddTombstone(std::string_view agent_id) {
  std::lock_guard lock(tomb_mu_);
  if (!tombstones_.insert(std::string(agent_id)).second) return;
  tomb_order_.emplace_back(agent_id);
  while (tomb_order_.size() > kMaxTombstones) {
    tombstones_.erase(tomb_order_.front());
    tomb_order_.pop_front();
  }
}

void AgentStore::ClearTombstone(std::string_view agent_id) {
  std::lock_guard lock(tomb_mu_);
  if (tombstones_.erase(std::string(agent_id)) == 0) return;
  auto it = std::find(tomb_order_.begin(), tomb_order_.end(), agent_id);
  if (it != tomb_order_.end()) tomb_order_.erase(it);
}

Status AgentStore::Flush() {
  if (!queue_) return Status::Ok();
  queue_->WaitResolved();
  std::lock_guard lock(err_mu_);
  Status s = first_error_;
  first_error_ = Status::Ok();
  return s;
}

KvStoreStats AgentStore::kv_stats() const {
  KvStoreStats s;
  if (queue_) s.queue = queue_->stats();
  s.blocks_written = blocks_written_;
  s.bytes_written = bytes_written_;
  s.blocks_evicted = blocks_evicted_;
  s.write_errors = write_errors_;
  s.tombstoned_writes = tombstoned_writes_;
  return s;
}

void AgentStore::RecordWriteError(const Status& s) {
  ++write_errors_;
  std::lock_guard lock(err_mu_);
  if (first_error_.ok()) first_error_ = s;
}

void AgentStore::WriterLoop() {
  std::vector<KvChainWrite> batch;
  while (queue_->PopBatch(options_.kv_batch_max_bytes, &batch)) {
    // Writes queued before their agent's removal are not written after it.
    const size_t before = batch.size();
    std::erase_if(batch, [&](const KvChainWrite& w) {
      return !w.agent_id.empty() && IsTombstoned(w.agent_id);
    });
    tombstoned_writes_ += before - batch.size();
    if (batch.empty()) {
      queue_->MarkDone();
      continue;
    }
    Status s = WriteBatch(batch);
    if (s.code() == StatusCode::kResourceExhausted) {
      // The map or the disk is full: older KV makes room for newer.
      size_t bytes = 0;
      for (const auto& w : batch) bytes += w.bytes();
      auto evicted = EvictLru(2 * bytes);
      if (evicted.ok() && *evicted > 0) s = WriteBatch(batch);
    }
    if (!s.ok()) RecordWriteError(s);
    if (s.ok() && options_.max_bytes > 0) {
      auto used = UsedBytes();
      if (used.ok() && *used > options_.max_bytes) {
        auto e = EvictKvTo(options_.max_bytes / 10 * 9);
        if (!e.ok()) RecordWriteError(e.status());
      }
    }
    batch.clear();
    queue_->MarkDone();
  }
}

Status AgentStore::WriteBatch(std::vector<KvChainWrite>& batch) {
  struct Job {
    const KvChainWrite* w;
    const KvBlockWrite* b;
    std::string key;
    Result<std::string> value = Status(StatusCode::kInternal, "not encoded");
  };
  std::vector<Job> jobs;
  {
    // Encode only blocks that are not stored intact yet (shared prefixes are
    // stored once); a damaged record is rewritten.
    ASSIGN_OR_RETURN(auto r, env_->BeginRead());
    std::unordered_set<std::string> seen;
    for (const auto& w : batch) {
      if (w.touch_only) continue;
      for (const auto& b : w.blocks) {
        if (b.data.empty()) continue;
        std::string key = KvKey(w.fp, b.hash);
        if (!seen.insert(key).second) continue;
        ASSIGN_OR_RETURN(auto v, r.Get(Db::kKv, key));
        if (v && OpenRecord(RecordType::kKvBlock, *v, "").ok()) continue;
        jobs.push_back(Job{&w, &b, std::move(key)});
      }
    }
  }
  write_pool_->ParallelFor(jobs.size(), [&](size_t i) {
    Job& j = jobs[i];
    j.value = ThreadCodec(options_.compression_level)
                  .Encode(j.w->fp, j.b->hash, j.b->tokens, j.b->data.view(), j.w->element_size);
  });
  for (const auto& j : jobs) {
    if (!j.value.ok()) return j.value.status();
  }

  // History appends go first: a turn's reply waits for its history, while
  // this transaction (megabytes, one fsync) only fills a cache. Bounded, so
  // a steady stream of turns cannot starve the cache.
  for (int i = 0; i < 100 && committer_->busy() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  uint64_t bytes = 0;
  Status s = env_->WriteBackground([&](LmdbEnv::WriteTxn& t) -> Status {
    const int64_t now = Now();
    bytes = 0;
    for (const auto& j : jobs) {
      RETURN_IF_ERROR(t.Put(Db::kKv, j.key, *j.value));
      ASSIGN_OR_RETURN(KvMeta m, LoadKvMetaForUpdate(t, j.key));
      m.stored_bytes = static_cast<uint32_t>(j.value->size());
      m.last_access_ms = static_cast<uint64_t>(now);
      RETURN_IF_ERROR(t.Put(Db::kKvMeta, j.key, EncodeKvMeta(m)));
      bytes += j.value->size();
    }
    for (const auto& w : batch) {
      if (w.touch_only) {
        for (const auto& b : w.blocks) {
          const std::string key = KvKey(w.fp, b.hash);
          ASSIGN_OR_RETURN(auto v, t.Get(Db::kKvMeta, key));
          if (!v) continue;
          // A touch only refreshes the LRU time of a readable meta. An
          // unreadable one is left as it is: Verify reports it and eviction
          // takes its block first. Rewriting it here would hide the damage
          // and invent a stored size of 0 (a block never evicted).
          auto m = DecodeKvMeta(*v, "");
          if (!m.ok()) continue;
          m->last_access_ms = static_cast<uint64_t>(now);
          RETURN_IF_ERROR(t.Put(Db::kKvMeta, key, EncodeKvMeta(*m)));
        }
        continue;
      }
      if (w.agent_id.empty() || !ValidateAgentId(w.agent_id).ok()) continue;
      for (size_t i = 0; i < w.blocks.size(); ++i) {
        const auto& b = w.blocks[i];
        const std::string ck = ChainKey(w.agent_id, w.fp, w.first_index + static_cast<uint32_t>(i));
        ASSIGN_OR_RETURN(auto old, t.Get(Db::kChains, ck));
        if (old) {
          auto e = DecodeChainEntry(*old, "");
          if (e.ok() && e->hash == b.hash) continue;
          if (e.ok()) RETURN_IF_ERROR(AddRef(t, KvKey(w.fp, e->hash), -1, now));
        }
        RETURN_IF_ERROR(t.Put(Db::kChains, ck, EncodeChainEntry(b.hash, b.tokens)));
        RETURN_IF_ERROR(AddRef(t, KvKey(w.fp, b.hash), +1, now));
      }
      // Cut what followed the written blocks: it continued another history.
      const std::string prefix = ChainPrefix(w.agent_id, w.fp);
      const std::string from =
          ChainKey(w.agent_id, w.fp, w.first_index + static_cast<uint32_t>(w.blocks.size()));
      std::vector<std::pair<std::string, std::optional<cache::BlockHash>>> cut;
      RETURN_IF_ERROR(t.Scan(
          Db::kChains, prefix,
          [&](std::string_view k, std::string_view v) -> Result<bool> {
            auto e = DecodeChainEntry(v, "");
            cut.emplace_back(std::string(k),
                             e.ok() ? std::optional<cache::BlockHash>(e->hash) : std::nullopt);
            return true;
          },
          from));
      for (const auto& [k, h] : cut) {
        RETURN_IF_ERROR(t.Del(Db::kChains, k).status());
        if (h) RETURN_IF_ERROR(AddRef(t, KvKey(w.fp, *h), -1, now));
      }
    }
    return Status::Ok();
  });
  if (!s.ok()) return s.WithContext("KV write-behind");
  blocks_written_ += jobs.size();
  bytes_written_ += bytes;
  return Status::Ok();
}

Result<KvPrefixInto> AgentStore::LoadPrefix(const ModelFingerprint& fp,
                                            std::span<const cache::BlockHash> hashes,
                                            std::span<const int32_t> tokens, int block_size,
                                            size_t max_blocks, const DecodeFn& decode) {
  if (!tokens.empty() &&
      (block_size <= 0 || tokens.size() < hashes.size() * static_cast<size_t>(block_size))) {
    return InvalidArgument("LoadKvPrefix: tokens do not cover the hashed blocks");
  }
  KvPrefixInto out;
  std::vector<std::string_view> values;
  std::vector<Status> status;
  {
    ASSIGN_OR_RETURN(auto r, env_->BeginRead());
    for (const auto& h : hashes) {
      if (values.size() >= max_blocks) break;
      ASSIGN_OR_RETURN(auto v, r.Get(Db::kKv, KvKey(fp, h)));
      if (!v) break;
      values.push_back(*v);
    }
    // Ask the kernel for every record's pages now: from a cold page cache
    // the reads then run ahead of the workers (deep queue) instead of one
    // page fault at a time per worker. A hint: failure changes nothing.
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    for (std::string_view v : values) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(v.data()) & ~(page - 1);
      const uintptr_t end = reinterpret_cast<uintptr_t>(v.data()) + v.size();
      ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
    }
    status.resize(values.size());
    // The views point into the map; the read transaction stays open until
    // every worker is done with them.
    pool_->ParallelFor(values.size(), [&](size_t i) {
      const std::string where = DescribeKey(kKvDb, KvKey(fp, hashes[i]));
      auto view = KvBlockCodec::Parse(values[i], fp, hashes[i], options_.max_block_bytes, where);
      if (!view.ok()) {
        status[i] = view.status();
        return;
      }
      if (!tokens.empty()) {
        const std::vector<int32_t> stored = view->Tokens();
        if (!std::equal(stored.begin(), stored.end(), tokens.begin() + i * block_size,
                        tokens.begin() + (i + 1) * block_size)) {
          status[i] = Corruption(where + ": stored tokens differ from the request's");
          return;
        }
      }
      status[i] = decode(i, *view, ThreadCodec(options_.compression_level), where);
    });
  }
  while (out.blocks < status.size() && status[out.blocks].ok()) ++out.blocks;
  if (out.blocks < status.size()) out.problem = status[out.blocks];
  if (queue_ && out.blocks > 0) {
    KvChainWrite touch;
    touch.fp = fp;
    touch.touch_only = true;
    for (size_t i = 0; i < out.blocks; ++i) touch.blocks.push_back(KvBlockWrite{hashes[i], {}, {}});
    queue_->Push(std::move(touch));
  }
  return out;
}

Result<KvPrefix> AgentStore::LoadKvPrefix(const ModelFingerprint& fp,
                                          std::span<const cache::BlockHash> hashes,
                                          std::span<const int32_t> tokens, int block_size) {
  KvPrefix out;
  out.blocks.resize(hashes.size());
  ASSIGN_OR_RETURN(KvPrefixInto got, LoadPrefix(fp, hashes, tokens, block_size, hashes.size(),
                                                [&](size_t i, const KvBlockView& view,
                                                    KvBlockCodec& codec, const std::string& where) {
                                                  KvBlock& b = out.blocks[i];
                                                  b.hash = hashes[i];
                                                  b.tokens = view.Tokens();
                                                  return codec.Decode(view, &b.data, where);
                                                }));
  out.blocks.resize(got.blocks);
  out.problem = got.problem;
  return out;
}

Result<KvPrefixInto> AgentStore::LoadKvPrefixInto(const ModelFingerprint& fp,
                                                  std::span<const cache::BlockHash> hashes,
                                                  std::span<const int32_t> tokens, int block_size,
                                                  std::span<std::byte> dst, size_t block_bytes) {
  if (block_bytes == 0) return InvalidArgument("LoadKvPrefixInto: block size in bytes is 0");
  return LoadPrefix(
      fp, hashes, tokens, block_size, dst.size() / block_bytes,
      [&](size_t i, const KvBlockView& view, KvBlockCodec& codec, const std::string& where) {
        char* p = reinterpret_cast<char*>(dst.data()) + i * block_bytes;
        return codec.DecodeInto(view, std::span<char>(p, block_bytes), where);
      });
}

Result<size_t> AgentStore::CountKvPrefix(const ModelFingerprint& fp,
                                         std::span<const cache::BlockHash> hashes) {
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  size_t n = 0;
  for (const cache::BlockHash& h : hashes) {
    ASSIGN_OR_RETURN(auto v, r.Get(Db::kKv, KvKey(fp, h)));
    if (!v) break;
    ++n;
  }
  return n;
}

Result<KvPrefix> AgentStore::LoadKvPrefixForTokens(const ModelFingerprint& fp,
                                                   std::span<const int32_t> tokens,
                                                   int block_size) {
  if (block_size <= 0) return InvalidArgument("block size must be positive");
  const std::vector<cache::BlockHash> hashes = cache::HashFullBlocks(tokens, block_size);
  return LoadKvPrefix(fp, hashes, tokens, block_size);
}

Result<std::vector<ChainEntry>> AgentStore::GetKvChain(std::string_view agent_id,
                                                       const ModelFingerprint& fp) {
  RETURN_IF_ERROR(ValidateAgentId(agent_id));
  ASSIGN_OR_RETURN(auto r, env_->BeginRead());
  std::vector<ChainEntry> out;
  const std::string prefix = ChainPrefix(agent_id, fp);
  RETURN_IF_ERROR(
      r.Scan(Db::kChains, prefix, [&](std::string_view k, std::string_view v) -> Result<bool> {
        ModelFingerprint kfp;
        uint32_t index = 0;
        if (!ParseChainKey(k, agent_id.size(), &kfp, &index) || index != out.size()) return false;
        auto e = DecodeChainEntry(v, DescribeKey(static_cast<int>(Db::kChains), k));
        if (!e.ok()) return false;  // the usable chain ends before a bad entry
        out.push_back(std::move(*e));
        return true;
      }));
  return out;
}

Result<uint64_t> AgentStore::EvictInTxn(LmdbEnv::WriteTxn& t, uint64_t bytes) {
  struct Candidate {
    uint64_t last_access;
    std::string key;
    KvMeta meta;
  };
  std::vector<Candidate> c;
  RETURN_IF_ERROR(
      t.Scan(Db::kKvMeta, {}, [&](std::string_view k, std::string_view v) -> Result<bool> {
        auto m = DecodeKvMeta(v, "");
        // Unreadable meta sorts first: its block is the first to go.
        KvMeta meta = m.ok() ? *m : KvMeta{0, 0, 1};
        if (meta.stored_bytes > 0) c.push_back({meta.last_access_ms, std::string(k), meta});
        return true;
      }));
  std::sort(c.begin(), c.end(),
            [](const Candidate& a, const Candidate& b) { return a.last_access < b.last_access; });
  uint64_t freed = 0, n = 0;
  for (auto& cand : c) {
    if (freed >= bytes) break;
    ASSIGN_OR_RETURN(bool existed, t.Del(Db::kKv, cand.key));
    freed += cand.meta.stored_bytes;
    n += existed ? 1 : 0;
    if (cand.meta.refcount == 0) {
      RETURN_IF_ERROR(t.Del(Db::kKvMeta, cand.key).status());
    } else {
      cand.meta.stored_bytes = 0;
      RETURN_IF_ERROR(t.Put(Db::kKvMeta, cand.key, EncodeKvMeta(cand.meta)));
    }
  }
  return n;
}

Result<uint64_t> AgentStore::EvictLru(uint64_t bytes) {
  uint64_t n = 0;
  RETURN_IF_ERROR(env_->WriteBackground([&](LmdbEnv::WriteTxn& t) -> Status {
    ASSIGN_OR_RETURN(n, EvictInTxn(t, bytes));
    return Status::Ok();
  }));
  blocks_evicted_ += n;
  return n;
}

Result<uint64_t> AgentStore::EvictKvTo(uint64_t target_bytes) {
  uint64_t total = 0;
  // Page accounting after deletes is not exact, so re-measure a few times.
  for (int round = 0; round < 8; ++round) {
    uint64_t n = 0;
    bool done = false;
    RETURN_IF_ERROR(env_->WriteBackground([&](LmdbEnv::WriteTxn& t) -> Status {
      ASSIGN_OR_RETURN(uint64_t used, t.UsedBytes());
      done = used <= target_bytes;
      n = 0;
      if (done) return Status::Ok();
      ASSIGN_OR_RETURN(n, EvictInTxn(t, used - target_bytes));
      return Status::Ok();
    }));
    total += n;
    blocks_evicted_ += n;
    if (done || n == 0) break;
  }
  return total;
}

}  // namespace agentkv::store
