// KvTransfer: admission through the tiers, the host tier's fill and restore
// paths, residency. The store's restore and save pipelines are in
// kv_transfer_store.cc.
#include "engine/kv_transfer.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace agentkv::engine {

KvTransfer::KvTransfer(backend::Backend* backend, cache::KvCacheManager* kv,
                       KvTransferOptions options, std::function<void()> wake)
    : backend_(backend), kv_(kv), options_(std::move(options)), wake_(std::move(wake)) {}

Result<std::unique_ptr<KvTransfer>> KvTransfer::Create(backend::Backend* backend,
                                                       cache::KvCacheManager* kv,
                                                       KvTransferOptions options,
                                                       std::function<void()> wake) {
  std::unique_ptr<KvTransfer> t(new KvTransfer(backend, kv, std::move(options), std::move(wake)));
  RETURN_IF_ERROR(t->Init());
  if (t->options_.kv_tier) t->loader_ = std::thread([p = t.get()] { p->LoaderLoop(); });
  return t;
}

KvTransfer::~KvTransfer() {
  Stop();
  // Copies may still read host-tier slots and restore slots.
  CompleteWrites(/*wait=*/true);
  kv_->SetEvictObserver(nullptr);
}

void KvTransfer::ReleaseBuffers() {
  Stop();
  CompleteWrites(/*wait=*/true);
  kv_->SetEvictObserver(nullptr);
  evicted_.clear();
  host_reads_.clear();
  host_.reset();
  restore_slots_.clear();
  save_staging_.reset();  // its chunks still in the tier keep it until released
}

void KvTransfer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  loader_cv_.notify_all();
  if (loader_.joinable()) loader_.join();
}

Status KvTransfer::Init() {
  group_ = kv_->prefix_group();
  load_latency_s_ = options_.tier_latency_s;
  // Tiers hold prefix-cache blocks; without prefix caching (sliding-window
  // models) there is nothing to restore into.
  if (group_ < 0) {
    options_.kv_tier.reset();
    options_.host_kv_bytes = 0;
    return Status::Ok();
  }
  block_bytes_ = backend_->cache_spec().BytesPerBlock(group_, options_.block_size);
  if (options_.host_kv_bytes >= block_bytes_) {
    HostKvTierOptions ho;
    ho.capacity_bytes = options_.host_kv_bytes;
    ho.block_bytes = block_bytes_;
    ho.block_size = options_.block_size;
    // The host may not give that much memory (pinned, on a GPU): then half
    // of it, else no tier; the engine runs either way.
    Result<std::unique_ptr<HostKvTier>> h = HostKvTier::Create(*backend_, ho);
    if (!h.ok() && h.status().code() == StatusCode::kResourceExhausted &&
        ho.capacity_bytes / 2 >= block_bytes_) {
      ho.capacity_bytes /= 2;
      h = HostKvTier::Create(*backend_, ho);
    }
    if (h.ok()) {
      host_ = std::move(h).value();
    } else if (h.status().code() != StatusCode::kResourceExhausted) {
      return h.status();
    }
  }
  if (host_) {
    kv_->SetEvictObserver(
        [this](int32_t block, const cache::BlockHash& hash, const cache::BlockHash& parent,
               std::span<const int32_t> tokens) { OnEvict(block, hash, parent, tokens); });
  }
  if (!options_.kv_tier) return Status::Ok();
  const int64_t pool_blocks = kv_->pool(group_).Stats().total;
  restore_slot_blocks_ = static_cast<int32_t>(std::clamp<int64_t>(
      static_cast<int64_t>(options_.restore_chunk_bytes / block_bytes_), 1, pool_blocks));
  for (int i = 0; i < kRestoreSlots; ++i) {
    ASSIGN_OR_RETURN(backend::HostBuffer b,
                     backend_->AllocateHostBuffer(block_bytes_ * restore_slot_blocks_));
    restore_slots_.push_back(std::move(b));
    free_slots_.push_back(i);
  }
  // Save staging: chunks of up to 16 MiB, at most the pool's size in all.
  const size_t bb = block_bytes_;
  const size_t total =
      std::min<size_t>(options_.save_staging_bytes, static_cast<size_t>(pool_blocks) * bb);
  const size_t chunk_blocks =
      std::clamp<size_t>((16ull << 20) / bb, 1, std::max<size_t>(1, total / bb));
  const int chunks = static_cast<int>(std::max<size_t>(1, total / (chunk_blocks * bb)));
  ASSIGN_OR_RETURN(save_staging_, StagingPool::Create(*backend_, chunk_blocks * bb, chunks));
  return Status::Ok();
}

std::unique_ptr<Sequence> KvTransfer::Admit(std::unique_ptr<Sequence> s, double busy) {
  if (group_ < 0 || (!host_ && !options_.kv_tier)) return s;
  const int bs = options_.block_size;
  // Whole blocks that could come from a tier: past what is cached, and
  // never the last prompt token (its logits start the reply).
  const int64_t usable = static_cast<int64_t>(s->prompt_len - 1) / bs;
  const int64_t resident = kv_->CachedPrefixTokens(s->tokens, s->cache_root) / bs;
  s->resident_before_restore = resident * bs;
  s->restore_broken = false;
  int64_t cached = resident;
  if (host_) {
    if (usable > cached) cached += RestoreFromHost(s.get(), usable);
    // Restored blocks are idle until admission; if the pool needs them back
    // meanwhile, they come from the host tier once more.
    s->restore_before_admit = true;
  }
  if (!options_.kv_tier || usable <= cached) return s;
  LoadJob job;
  job.id = s->id;
  job.tokens.assign(s->tokens.begin(), s->tokens.begin() + usable * bs);
  job.root = s->cache_root;
  job.first_block = static_cast<int32_t>(cached);
  job.max_blocks = static_cast<int32_t>(usable - cached);
  job.plan = options_.split_restores && prefill_cost_.known();
  if (job.plan) {
    job.rates = PlanRates(cached, busy);
    // Planned with everything stored (the most loading can give): when
    // recomputing is faster even so, the store is not asked at all.
    RestoreRates upper = job.rates;
    upper.prefix_blocks = job.max_blocks;
    if (PlanRestore(upper).load_blocks == 0) {
      ++stats_.recomputed_restores;
      return s;
    }
  }
  loading_.emplace(s->id, std::move(s));
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_jobs_.push_back(std::move(job));
  }
  loader_cv_.notify_one();
  return nullptr;
}

RestoreRates KvTransfer::PlanRates(int64_t cached_blocks, double busy) const {
  RestoreRates r;
  r.cached_blocks = cached_blocks;
  r.block_size = options_.block_size;
  r.prefill = prefill_cost_;
  r.tier_bytes_per_s = load_seconds_ > 0 ? load_bytes_ / load_seconds_ : options_.tier_bytes_per_s;
  r.tier_latency_s = load_latency_s_;
  r.bytes_per_block = block_bytes_;
  r.gpu_busy_factor = busy;
  return r;
}

void KvTransfer::RestoreBeforeAdmit(Sequence* s) {
  if (!host_) return;
  // Placeholders of picks still in flight are not real tokens yet.
  const int64_t real = static_cast<int64_t>(s->tokens.size()) - s->in_flight;
  if (real <= 1) return;
  const int64_t usable = (real - 1) / options_.block_size;
  RestoreFromHost(s, usable);
}

int32_t KvTransfer::RestoreFromHost(Sequence* s, int64_t usable_blocks) {
  // Blocks evicted moments ago may be what this sequence needs (a
  // preempted one's, typically): their reads are issued now.
  FlushEvictions();
  const int bs = options_.block_size;
  const std::span<const int32_t> tokens =
      std::span<const int32_t>(s->tokens).first(static_cast<size_t>(usable_blocks) * bs);
  const int32_t first =
      static_cast<int32_t>(kv_->CachedPrefixTokens(s->tokens, s->cache_root) / bs);
  if (first >= usable_blocks) return 0;
  // The chain hash before `first`: the cached head's last block.
  cache::BlockHash parent = s->cache_root;
  if (first > 0)
    parent =
        HashFullBlocks(tokens.first(static_cast<size_t>(first) * bs), bs, s->cache_root).back();
  const int32_t want = static_cast<int32_t>(usable_blocks - first);
  bool pending = false;
  std::vector<HostKvTier::Hit> hits = host_->Match(tokens, first, want, parent, &pending);
  if (pending) {
    // The run stops at a block whose device read is still in flight: wait
    // for the reads (a copy is cheaper than the prefill it saves).
    host_->Release(hits);
    CommitHostReads(/*wait=*/true);
    hits = host_->Match(tokens, first, want, parent);
  }
  if (hits.empty()) return 0;
  std::vector<cache::BlockHash> hashes;
  for (const HostKvTier::Hit& h : hits) hashes.push_back(h.hash);
  // The manager allocates and registers; the data goes in right after,
  // before any step can read those blocks. Allocating may evict pool blocks
  // into the host tier, never the leased hits.
  std::vector<int32_t> ids;
  std::vector<size_t> which;
  const int32_t n =
      kv_->RestoreBlocks(s->tokens, s->cache_root, first, hashes, [&](size_t i, int32_t block) {
        ids.push_back(block);
        which.push_back(i);
        return Status::Ok();
      });
  FlushEvictions();
  PendingWrite w;
  w.issued = std::chrono::steady_clock::now();
  Status st;
  // One copy per run of hits in adjacent host slots, none waited for: the
  // hits stay leased until the backend is done reading them.
  for (size_t i = 0; i < static_cast<size_t>(n) && st.ok();) {
    size_t j = i + 1;
    while (j < static_cast<size_t>(n) && which[j] == which[j - 1] + 1 &&
           hits[which[j]].data.data() == hits[which[j - 1]].data.data() + block_bytes_)
      ++j;
    const std::byte* from = hits[which[i]].data.data();
    Result<uint64_t> t =
        backend_->StartWriteBlocks(group_, std::span<const int32_t>(ids).subspan(i, j - i),
                                   std::span<const std::byte>(from, (j - i) * block_bytes_));
    if (t.ok()) {
      w.any = true;
      w.ticket = *t;
    } else {
      st = t.status();
    }
    i = j;
  }
  const double issue_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - w.issued).count();
  stats_.restore_write_seconds += issue_seconds;
  stats_.host_write_seconds += issue_seconds;
  if (w.any) {
    w.hits = std::move(hits);
    HoldUntilWritten(std::move(w));
  } else {
    host_->Release(hits);
  }
  if (!st.ok()) {
    // The new blocks are registered but hold garbage: drop every idle cached
    // block of the group (they are idle) rather than serve them.
    capture_evictions_ = false;
    kv_->EvictIdle(group_, std::numeric_limits<int32_t>::max());
    capture_evictions_ = true;
    ++stats_.restore_problems;
    return 0;
  }
  // Blocks another request brought in meanwhile count too: the chain is
  // whole up to the last one written.
  const int32_t covered = n > 0 ? static_cast<int32_t>(which[n - 1]) + 1 : 0;
  s->host_restored_tokens += static_cast<int64_t>(n) * bs;
  stats_.host_restored_tokens += static_cast<int64_t>(n) * bs;
  return covered;
}

void KvTransfer::HoldUntilWritten(PendingWrite w) {
  if (!w.any) return;
  pending_writes_.push_back(std::move(w));
  // A synchronous backend is done already: nothing stays held.
  CompleteWrites(/*wait=*/false);
}

void KvTransfer::CompleteWrites(bool wait) {
  while (!pending_writes_.empty()) {
    PendingWrite& w = pending_writes_.front();
    Result<bool> done = backend_->WriteDone(w.ticket, wait);
    if (done.ok() && !*done) break;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - w.issued).count();
    if (w.slot >= 0) {
      stats_.restore_write_done_seconds += seconds;
    } else {
      stats_.host_write_done_seconds += seconds;
    }
    if (!done.ok()) {
      // The blocks may not hold the bytes; they are idle unless a step
      // already took them, so drop every idle cached block of the group
      // rather than serve them.
      DropIdleBlocks();
      ++stats_.restore_problems;
    }
    if (!w.hits.empty()) host_->Release(w.hits);
    if (w.slot >= 0) FreeSlot(w.slot);
    pending_writes_.pop_front();
  }
}

void KvTransfer::OnEvict(int32_t block, const cache::BlockHash& hash,
                         const cache::BlockHash& parent, std::span<const int32_t> tokens) {
  if (!capture_evictions_) return;
  if (host_->Touch(hash)) return;  // held already (a finished turn's, say)
  HostKvTier::Slot slot = host_->Reserve(parent, hash, tokens);
  if (slot.empty()) return;
  evicted_.push_back(Evicted{block, hash, slot});
}

void KvTransfer::FlushEvictions() {
  if (evicted_.empty()) return;
  // One read per run of adjacent slots.
  for (size_t i = 0; i < evicted_.size();) {
    size_t j = i + 1;
    while (j < evicted_.size() &&
           evicted_[j].slot.data() == evicted_[j - 1].slot.data() + block_bytes_)
      ++j;
    std::vector<int32_t> blocks;
    HostRead r;
    for (size_t k = i; k < j; ++k) {
      blocks.push_back(evicted_[k].block);
      r.hashes.push_back(evicted_[k].hash);
    }
    Result<uint64_t> t = backend_->StartReadBlocks(
        group_, blocks, std::span<std::byte>(evicted_[i].slot.data(), (j - i) * block_bytes_));
    if (t.ok()) {
      r.ticket = *t;
      host_reads_.push_back(std::move(r));
    } else {
      for (const cache::BlockHash& h : r.hashes) host_->Abort(h);
    }
    i = j;
  }
  evicted_.clear();
  CommitHostReads(/*wait=*/false);
}

void KvTransfer::CommitHostReads(bool wait) {
  while (!host_reads_.empty()) {
    HostRead& r = host_reads_.front();
    Result<bool> done = backend_->ReadDone(r.ticket, wait);
    if (done.ok() && !*done) break;
    for (const cache::BlockHash& h : r.hashes) {
      if (done.ok()) {
        host_->Commit(h);
      } else {
        host_->Abort(h);
      }
    }
    host_reads_.pop_front();
  }
}

void KvTransfer::RetireAgent(Sequence* s) {
  const std::string& key = s->request.agent_key;
  cache::AgentCache cache = kv_->PinForAgent(s->id);
  ResidentAgent& a = agents_[key];
  kv_->ReleaseAgentCache(&a.cache);
  a.cache = std::move(cache);
  SaveAgentKv(s);
  const int64_t resident = kv_->ResidentTokens(a.cache);
  std::lock_guard<std::mutex> lock(mu_);
  agent_resident_[key] = resident;
}

void KvTransfer::DropAgent(const std::string& agent_key) {
  // Its saves first: the agent is being deleted, so the ones still waiting
  // for staging go now, and the ones whose reads are in flight finish into
  // nothing (CompleteSaves).
  for (const SaveJob& job : save_backlog_)
    if (job.agent_key == agent_key)
      stats_.save_dropped_blocks += static_cast<int64_t>(job.blocks.size() - job.next);
  std::erase_if(save_backlog_, [&](const SaveJob& job) { return job.agent_key == agent_key; });
  for (PendingSave& p : pending_saves_)
    if (p.agent_key == agent_key) p.dropped = true;
  auto it = agents_.find(agent_key);
  if (it != agents_.end()) {
    kv_->ReleaseAgentCache(&it->second.cache);
    agents_.erase(it);
  }
  // The store may delete the agent's blocks with it: forget what we
  // believed it had, so later saves write data again.
  tier_has_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  agent_resident_.erase(agent_key);
}

void KvTransfer::ReleaseAgents() {
  for (auto& [key, agent] : agents_) kv_->ReleaseAgentCache(&agent.cache);
  agents_.clear();
}

int64_t KvTransfer::AgentResidentTokens(const std::string& agent_key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agent_resident_.find(agent_key);
  return it == agent_resident_.end() ? 0 : it->second;
}

bool KvTransfer::HasLoaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !loaded_.empty();
}

std::unique_ptr<Sequence> KvTransfer::CancelParked(RequestId id) {
  auto it = loading_.find(id);
  if (it == loading_.end()) return nullptr;
  std::unique_ptr<Sequence> s = std::move(it->second);
  loading_.erase(it);
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_cancelled_.insert(id);
  }
  loader_cv_.notify_all();
  return s;
}

std::vector<std::unique_ptr<Sequence>> KvTransfer::TakeParked() {
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto& [id, s] : loading_) out.push_back(std::move(s));
  loading_.clear();
  return out;
}

KvTransferStats KvTransfer::Stats() const {
  KvTransferStats s = stats_;
  s.resident_agents = static_cast<int64_t>(agents_.size());
  s.loading = static_cast<int64_t>(loading_.size());
  if (host_) s.host = host_->Stats();
  return s;
}

}  // namespace agentkv::engine
