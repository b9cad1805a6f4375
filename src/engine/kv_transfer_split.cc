// KvTransfer: split restores. The loader counts what the store holds of a
// parked request's prefix and plans (PlanSplit); a plan that recomputes a
// head releases the request at once with its prefill stopped at the end of
// the head (StartSplit), and the tail is loaded into held pool blocks
// (ApplySplitChunk) until both meet (AttachSplit).
#include <algorithm>

#include "engine/kv_transfer.h"

namespace agentkv::engine {

bool KvTransfer::PlanSplit(LoadJob* job, int32_t* next, int32_t* end) {
  Result<int32_t> stored = options_.kv_tier->CountStored(
      job->tokens, job->root, options_.block_size, job->first_block, job->max_blocks);
  // Errors surface in the load itself.
  if (!stored.ok()) return false;
  RestoreRates rates = job->rates;
  rates.prefix_blocks = std::clamp(*stored, 0, job->max_blocks);
  const RestorePlan plan = PlanRestore(rates);
  if (plan.recompute_blocks <= 0) return false;
  LoadChunk c;
  c.id = job->id;
  c.head_blocks = static_cast<int32_t>(plan.recompute_blocks);
  c.first_block = job->first_block + c.head_blocks;
  c.last = plan.load_blocks <= 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (c.last) load_cancelled_.erase(job->id);
    loaded_.push_back(c);
  }
  if (wake_) wake_();
  if (c.last) return true;
  *next = c.first_block;
  *end = job->first_block + static_cast<int32_t>(rates.prefix_blocks);
  return false;
}

std::unique_ptr<Sequence> KvTransfer::StartSplit(const LoadChunk& c) {
  auto it = loading_.find(c.id);
  if (it == loading_.end()) return nullptr;  // cancelled meanwhile
  std::unique_ptr<Sequence> s = std::move(it->second);
  loading_.erase(it);
  // Recompute everything: an ordinary prefill.
  if (c.last) return s;
  const int bs = options_.block_size;
  ++stats_.split_restores;
  stats_.split_recomputed_tokens += static_cast<int64_t>(c.head_blocks) * bs;
  s->prefill_limit = static_cast<int64_t>(c.first_block) * bs;
  Split& sp = splits_[c.id];
  const size_t whole = (s->prompt_len - 1) / bs * bs;
  sp.tokens.assign(s->tokens.begin(), s->tokens.begin() + static_cast<std::ptrdiff_t>(whole));
  sp.root = s->cache_root;
  return s;
}

void KvTransfer::ApplySplitChunk(const LoadChunk& c, PendingWrite* w) {
  Split& sp = splits_.at(c.id);
  if (c.last) sp.loaded = true;
  if (c.last && !c.problem.ok()) ++stats_.restore_problems;
  if (c.blocks <= 0 || sp.broken) return;
  const int bs = options_.block_size;
  const auto end = static_cast<size_t>(c.first_block + c.blocks) * bs;
  if (end > sp.tokens.size()) {
    sp.broken = true;
    return;
  }
  const std::vector<cache::BlockHash> all =
      HashFullBlocks(std::span<const int32_t>(sp.tokens).first(end), bs, sp.root);
  const std::span<const cache::BlockHash> hashes = std::span(all).subspan(c.first_block);
  // Blocks cached already are held as they are; the new ones are written
  // right after, in runs of consecutive chunk positions.
  std::vector<std::pair<size_t, int32_t>> fresh;
  const int32_t n = kv_->RestoreHeldBlocks(c.id, sp.tokens, sp.root, c.first_block, hashes,
                                           [&](size_t i, int32_t block) {
                                             fresh.emplace_back(i, block);
                                             return Status::Ok();
                                           });
  FlushEvictions();
  Status st;
  for (size_t i = 0; i < fresh.size() && st.ok();) {
    size_t j = i + 1;
    while (j < fresh.size() && fresh[j].first == fresh[j - 1].first + 1) ++j;
    std::vector<int32_t> ids;
    for (size_t k = i; k < j; ++k) ids.push_back(fresh[k].second);
    st = WriteChunk(c, fresh[i].first, ids, w);
    i = j;
  }
  if (!st.ok()) {
    // Registered blocks hold garbage: let go of them and drop every idle
    // cached block rather than serve them; the head's prefill goes on.
    kv_->ReleaseHold(c.id);
    DropIdleBlocks();
    ++stats_.restore_problems;
    sp.broken = true;
    return;
  }
  if (n < c.blocks) sp.broken = true;  // the rest cannot join the chain
  sp.restored_tokens += static_cast<int64_t>(fresh.size()) * bs;
  stats_.restored_tokens += static_cast<int64_t>(fresh.size()) * bs;
  for (int32_t i = 0; i < n; ++i) tier_has_.insert(hashes[i]);
}

std::vector<RequestId> KvTransfer::LoadedSplits() const {
  std::vector<RequestId> out;
  for (const auto& [id, sp] : splits_)
    if (sp.loaded) out.push_back(id);
  return out;
}

size_t KvTransfer::splits_loading() const {
  return static_cast<size_t>(std::count_if(splits_.begin(), splits_.end(),
                                           [](const auto& kv) { return !kv.second.loaded; }));
}

bool KvTransfer::AttachSplit(Sequence* s) {
  auto it = splits_.find(s->id);
  if (it == splits_.end()) {
    s->prefill_limit = -1;
    return true;
  }
  Split& sp = it->second;
  // Only a running request whose prefill reached the limit can take the
  // tail. One still waiting (not admitted yet, or preempted) keeps the tail
  // held: its head may not exist yet, and once admitted it prefills up to
  // the limit again (or finds head and tail cached, and attaches both).
  if (!sp.loaded || !kv_->HasSequence(s->id) || s->computed < s->prefill_limit) return false;
  Result<int64_t> n = kv_->AttachCachedContinuation(s->id, s->tokens);
  if (n.ok()) {
    s->computed += *n;
    s->cached_prompt_tokens += *n;
  }
  s->restored_tokens += sp.restored_tokens;
  kv_->ReleaseHold(s->id);
  splits_.erase(it);
  s->prefill_limit = -1;
  return true;
}

void KvTransfer::CancelSplit(RequestId id) {
  auto it = splits_.find(id);
  if (it == splits_.end()) return;
  if (!it->second.loaded) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      load_cancelled_.insert(id);
    }
    loader_cv_.notify_all();
  }
  kv_->ReleaseHold(id);
  splits_.erase(it);
}

void KvTransfer::NoteLoadRate(const LoadChunk& c) {
  if (c.blocks <= 0 || !(c.load_seconds > 0)) return;
  // Older loads count less (the page cache warms, the disk gets busy).
  constexpr double kKeep = 0.9;
  const double bytes = static_cast<double>(c.blocks) * block_bytes_;
  load_bytes_ = kKeep * load_bytes_ + bytes;
  load_seconds_ = kKeep * load_seconds_ + c.load_seconds;
  stats_.tier_bytes_per_s = load_bytes_ / load_seconds_;
  // The first chunk's time beyond what its bytes take at that rate.
  if (c.since_job_start >= 0) {
    const double latency = std::max(0.0, c.since_job_start - bytes / stats_.tier_bytes_per_s);
    load_latency_s_ = kKeep * load_latency_s_ + (1 - kKeep) * latency;
  }
  stats_.tier_latency_s = load_latency_s_;
}

}  // namespace agentkv::engine
