// KvTransfer: the store's pipelines. Admit parks a request whose prompt
// continues past the pool and the host tier and queues a load job; the
// loader thread decompresses the stored blocks, a chunk at a time, into
// pinned staging slots; the engine thread registers each chunk in the
// prefix cache and starts one batched asynchronous host-to-device copy of
// it into the pool (the slot goes back to the loader once the copy is
// done) while the loader fills the next slot; the last chunk releases the
// request.
// After a turn, SaveAgentKv hands the tier the blocks new to the agent's
// chain, read off the device into save staging; the same bytes are kept in
// the host tier (one host copy) once the read is done.
#include <chrono>
#include <limits>

#include "engine/kv_transfer.h"

namespace agentkv::engine {

int KvTransfer::AcquireSlot(RequestId id) {
  std::unique_lock<std::mutex> lock(mu_);
  loader_cv_.wait(
      lock, [&] { return stopping_ || load_cancelled_.count(id) > 0 || !free_slots_.empty(); });
  if (stopping_ || load_cancelled_.count(id) > 0) return -1;
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void KvTransfer::LoaderLoop() {
  cache::KvTier* tier = options_.kv_tier.get();
  const int bs = options_.block_size;
  while (true) {
    LoadJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      loader_cv_.wait(lock, [&] { return stopping_ || !load_jobs_.empty(); });
      if (stopping_) return;
      job = std::move(load_jobs_.front());
      load_jobs_.pop_front();
    }
    const auto job_start = std::chrono::steady_clock::now();
    int32_t next = job.first_block;
    int32_t end = job.first_block + job.max_blocks;
    if (job.plan && PlanSplit(&job, &next, &end)) continue;
    for (bool first = true;; first = false) {
      LoadChunk c;
      c.id = job.id;
      c.first_block = next;
      c.slot = AcquireSlot(job.id);
      if (c.slot >= 0) {
        const auto t0 = std::chrono::steady_clock::now();
        // Asks for the whole rest of the job: the tier decodes what fits the
        // slot and prefetches what follows.
        Result<cache::KvTierLoadInto> r =
            tier->LoadInto(job.tokens, job.root, bs, next, end - next,
                           restore_slots_[c.slot].span(), block_bytes_);
        c.load_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (first)
          c.since_job_start =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count();
        if (r.ok()) {
          c.blocks = r->blocks;
          c.problem = r->problem;
        } else {
          c.problem = r.status();
        }
      }
      next += c.blocks;
      const int32_t asked = std::min(restore_slot_blocks_, end - c.first_block);
      const bool last = c.slot < 0 || !c.problem.ok() || c.blocks < asked || next >= end;
      c.last = last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (last) load_cancelled_.erase(job.id);
        loaded_.push_back(std::move(c));
      }
      if (wake_) wake_();
      if (last) break;
    }
  }
}

std::vector<std::unique_ptr<Sequence>> KvTransfer::TakeRestored() {
  std::deque<LoadChunk> loaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loaded.swap(loaded_);
  }
  std::vector<std::unique_ptr<Sequence>> ready;
  for (LoadChunk& c : loaded)
    if (std::unique_ptr<Sequence> s = ApplyChunk(std::move(c))) ready.push_back(std::move(s));
  return ready;
}

std::unique_ptr<Sequence> KvTransfer::ApplyChunk(LoadChunk c) {
  stats_.restore_load_seconds += c.load_seconds;
  NoteLoadRate(c);
  if (c.head_blocks >= 0) return StartSplit(c);
  PendingWrite w;
  if (splits_.count(c.id) > 0) {
    ApplySplitChunk(c, &w);
    ReturnSlot(c, std::move(w));
    return nullptr;
  }
  auto it = loading_.find(c.id);
  Sequence* s = it == loading_.end() ? nullptr : it->second.get();
  if (s != nullptr && c.last && !c.problem.ok()) ++stats_.restore_problems;
  if (s != nullptr && c.blocks > 0 && !s->restore_broken) {
    const int bs = options_.block_size;
    const std::vector<cache::BlockHash> all =
        HashFullBlocks(std::span<const int32_t>(s->tokens).first(
                           static_cast<size_t>(c.first_block + c.blocks) * bs),
                       bs, s->cache_root);
    const std::span<const cache::BlockHash> hashes = std::span(all).subspan(c.first_block);
    // The manager allocates and registers; the chunk's data goes in with one
    // batched copy right after, before any step can read those blocks.
    size_t first_new = 0;
    std::vector<int32_t> ids;
    const int32_t n = kv_->RestoreBlocks(s->tokens, s->cache_root, c.first_block, hashes,
                                         [&](size_t i, int32_t block) {
                                           if (ids.empty()) first_new = i;
                                           ids.push_back(block);
                                           return Status::Ok();
                                         });
    // Blocks the allocations evicted are read out before they are written.
    FlushEvictions();
    int32_t written = n;
    if (n > 0 && !WriteChunk(c, first_new, std::span<const int32_t>(ids).first(n), &w).ok()) {
      // The new blocks are registered but hold garbage: drop every idle
      // cached block of the group (they are idle) rather than serve them.
      DropIdleBlocks();
      ++stats_.restore_problems;
      written = 0;
      s->restore_broken = true;
    }
    // Blocks of the chunk that were cached already count as restored too
    // (another request brought them in meanwhile): the chain is intact.
    const int32_t covered = written > 0 ? static_cast<int32_t>(first_new) + written : 0;
    if (covered < c.blocks) s->restore_broken = true;
    for (int32_t i = 0; i < covered; ++i) tier_has_.insert(hashes[i]);
    s->restored_tokens += static_cast<int64_t>(written) * bs;
    stats_.restored_tokens += static_cast<int64_t>(written) * bs;
  }
  ReturnSlot(c, std::move(w));
  if (s == nullptr || !c.last) return nullptr;
  std::unique_ptr<Sequence> owned = std::move(it->second);
  loading_.erase(it);
  return owned;
}

void KvTransfer::ReturnSlot(const LoadChunk& c, PendingWrite w) {
  if (c.last) {
    std::lock_guard<std::mutex> lock(mu_);
    load_cancelled_.erase(c.id);
  }
  if (c.slot < 0) return;
  if (w.any) {
    // The loader may refill the slot only once the copies out of it are
    // done. A store chunk waits for them here, as before copies were
    // asynchronous: 64 MiB take ~2 ms, and the one 8B load-everything
    // restore measured with the slot held until a later loop iteration took
    // 5.9 s against 2.9 s (not understood yet; host-tier restores, where
    // the engine thread's wait was 0.2 s for a 32k-token agent, stay
    // asynchronous).
    w.slot = c.slot;
    HoldUntilWritten(std::move(w));
    CompleteWrites(/*wait=*/true);
    return;
  }
  FreeSlot(c.slot);
}

void KvTransfer::FreeSlot(int slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_slots_.push_back(slot);
  }
  loader_cv_.notify_all();
}

Status KvTransfer::WriteChunk(const LoadChunk& c, size_t first, std::span<const int32_t> ids,
                              PendingWrite* w) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!w->any) w->issued = t0;
  Result<uint64_t> t = backend_->StartWriteBlocks(
      group_, ids,
      restore_slots_[c.slot].span().subspan(first * block_bytes_, ids.size() * block_bytes_));
  stats_.restore_write_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!t.ok()) return t.status();
  w->any = true;
  w->ticket = *t;
  return Status::Ok();
}

void KvTransfer::DropIdleBlocks() {
  capture_evictions_ = false;
  kv_->EvictIdle(group_, std::numeric_limits<int32_t>::max());
  capture_evictions_ = true;
}

void KvTransfer::SaveAgentKv(Sequence* s) {
  cache::KvTier* tier = options_.kv_tier.get();
  if (tier == nullptr || group_ < 0 || !save_staging_) return;
  ResidentAgent& a = agents_[s->request.agent_key];
  const std::vector<cache::BlockHash>& hashes = kv_->BlockHashes(s->id);
  const size_t n = std::min(hashes.size(), kv_->Table(s->id, group_).blocks().size());
  size_t same = 0;
  while (same < n && same < a.saved.size() && a.saved[same] == hashes[same]) ++same;
  if (same == n) {
    a.saved.assign(hashes.begin(), hashes.begin() + n);
    return;
  }
  if (tier_has_.size() > (1u << 20)) tier_has_.clear();
  const auto t0 = std::chrono::steady_clock::now();
  const int bs = options_.block_size;
  SaveJob job;
  job.agent_key = s->request.agent_key;
  job.first_index = static_cast<uint32_t>(same);
  job.parent = same == 0 ? s->cache_root : hashes[same - 1];
  for (size_t i = same; i < n; ++i) {
    cache::KvTierBlock b;
    b.hash = hashes[i];
    b.tokens.assign(s->tokens.begin() + i * bs, s->tokens.begin() + (i + 1) * bs);
    job.need_data.push_back(!tier_has_.count(b.hash));
    // Counted now so that a later turn (or another agent) sharing the block
    // only links it.
    tier_has_.insert(b.hash);
    job.blocks.push_back(std::move(b));
  }
  a.saved.assign(hashes.begin(), hashes.begin() + n);
  KeepInHostTier(job);
  save_backlog_.push_back(std::move(job));
  PumpSaves();
  stats_.save_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void KvTransfer::KeepInHostTier(const SaveJob& job) {
  if (!host_) return;
  // The finished turn's blocks stay in host memory too, read straight from
  // the device into host slots (a DMA beside the steps): copying them out of
  // the store's staging once the save's read is done would cost the engine
  // thread a memcpy of every finished turn (1.3 GB for 64 agents of 640
  // tokens on the 1B shape), between steps.
  cache::BlockHash parent = job.parent;
  for (const cache::KvTierBlock& b : job.blocks) {
    const cache::BlockHash block_parent = parent;
    parent = b.hash;
    if (host_->Touch(b.hash)) continue;
    const std::optional<int32_t> block = kv_->CachedBlock(b.hash);
    if (!block) continue;
    HostKvTier::Slot slot = host_->Reserve(block_parent, b.hash, b.tokens);
    if (slot.empty()) break;  // full of blocks being written or read
    evicted_.push_back(Evicted{*block, b.hash, slot});
  }
  FlushEvictions();
}

void KvTransfer::PumpSaves() {
  const size_t bytes = block_bytes_;
  const size_t per_chunk = save_staging_->chunk_bytes() / bytes;
  while (!save_backlog_.empty()) {
    SaveJob& job = save_backlog_.front();
    PendingSave p;
    p.agent_key = job.agent_key;
    p.first_index = job.first_index + static_cast<uint32_t>(job.next);
    p.parent = job.next == 0 ? job.parent : job.blocks[job.next - 1].hash;
    std::shared_ptr<std::span<std::byte>> chunk;
    std::vector<int32_t> ids;  // read into `chunk`
    bool failed = false, out_of_staging = false, lost = false;
    auto read_chunk = [&]() {
      if (ids.empty() || failed) return;
      Result<uint64_t> t = backend_->StartReadBlocks(group_, ids, chunk->first(ids.size() * bytes));
      if (t.ok()) {
        p.ticket = *t;
      } else {
        failed = true;
      }
      ids.clear();
    };
    for (; job.next < job.blocks.size(); ++job.next) {
      cache::KvTierBlock& b = job.blocks[job.next];
      if (job.need_data[job.next]) {
        const std::optional<int32_t> block = kv_->CachedBlock(b.hash);
        if (!block) {  // evicted while it waited: the chain ends before it
          lost = true;
          break;
        }
        if (!chunk || ids.size() == per_chunk) {
          read_chunk();
          chunk = save_staging_->TryAcquire();
          if (!chunk) {
            out_of_staging = true;
            break;
          }
        }
        const std::span<std::byte> slot = chunk->subspan(ids.size() * bytes, bytes);
        b.data = SharedBytes(
            chunk, std::string_view(reinterpret_cast<const char*>(slot.data()), slot.size()));
        ids.push_back(*block);
        ++stats_.saved_blocks;
      }
      p.blocks.push_back(std::move(b));
    }
    read_chunk();
    if (failed) {
      // Nothing may still be copying into chunks that go back to the pool;
      // the chain ends before this run (the agent's next turn re-saves).
      (void)backend_->ReadDone(p.ticket, /*wait=*/true);
      p.blocks.clear();
      lost = true;
    }
    if (!p.blocks.empty()) pending_saves_.push_back(std::move(p));
    if (lost) {
      stats_.save_dropped_blocks += static_cast<int64_t>(job.blocks.size() - job.next);
      ResidentAgent* a = nullptr;
      if (auto it = agents_.find(job.agent_key); it != agents_.end()) a = &it->second;
      // Forget what the tier will not get, so the agent's next turn saves it.
      if (a != nullptr && a->saved.size() > job.first_index + job.next) {
        a->saved.resize(job.first_index + job.next);
      }
      for (size_t i = job.next; i < job.blocks.size(); ++i)
        if (job.need_data[i]) tier_has_.erase(job.blocks[i].hash);
      save_backlog_.pop_front();
      continue;
    }
    if (out_of_staging) return;
    save_backlog_.pop_front();
  }
}

void KvTransfer::CompleteSaves(bool wait) {
  CompleteWrites(wait);
  if (host_) CommitHostReads(wait);
  cache::KvTier* tier = options_.kv_tier.get();
  while (!pending_saves_.empty()) {
    PendingSave& p = pending_saves_.front();
    Result<bool> done = backend_->ReadDone(p.ticket, wait);
    if (done.ok() && !*done) break;
    // A failed read hands nothing over (its bytes are garbage); the tier
    // may then lack blocks it was thought to have, so forget that.
    if (done.ok() && p.dropped) {
      // The agent was deleted while its blocks were being read.
    } else if (done.ok()) {
      tier->Save(p.agent_key, p.first_index, std::move(p.blocks));
    } else {
      tier_has_.clear();
    }
    pending_saves_.pop_front();
  }
  if (!save_backlog_.empty() && save_staging_->free_chunks() > 0) PumpSaves();
}

void KvTransfer::DrainSaves() {
  auto last_progress = std::chrono::steady_clock::now();
  while (SavesPending()) {
    const size_t before = pending_saves_.size() + save_backlog_.size();
    const size_t next = save_backlog_.empty() ? 0 : save_backlog_.front().next;
    CompleteSaves(/*wait=*/true);
    if (pending_saves_.size() + save_backlog_.size() != before ||
        (!save_backlog_.empty() && save_backlog_.front().next != next)) {
      last_progress = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last_progress > std::chrono::seconds(30)) {
      for (const SaveJob& job : save_backlog_)
        stats_.save_dropped_blocks += static_cast<int64_t>(job.blocks.size() - job.next);
      save_backlog_.clear();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (host_) CommitHostReads(/*wait=*/true);
  CompleteWrites(/*wait=*/true);
}

}  // namespace agentkv::engine
