#include "store/kv_write_queue.h"

namespace agentkv::store {

size_t KvChainWrite::bytes() const {
  size_t n = sizeof(KvChainWrite) + agent_id.size();
  for (const auto& b : blocks) n += sizeof(KvBlockWrite) + b.data.size() + 4 * b.tokens.size();
  return n;
}

bool KvWriteQueue::Push(KvChainWrite w) {
  const size_t n = w.bytes();
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    // Oldest first; removals stay (they are small and undo writes that
    // may be committed already).
    for (auto it = queue_.begin(); it != queue_.end() && queued_bytes_ + n > max_bytes_;) {
      if (it->write.discard_unrecorded) {
        ++it;
        continue;
      }
      queued_bytes_ -= it->bytes;
      ++dropped_writes_;
      dropped_bytes_ += it->bytes;
      it = queue_.erase(it);
    }
    queued_bytes_ += n;
    queue_.push_back(Item{next_seq_++, n, std::move(w)});
  }
  work_cv_.notify_one();
  resolved_cv_.notify_all();
  return true;
}

bool KvWriteQueue::PopBatch(size_t max_batch_bytes, std::vector<KvChainWrite>* out) {
  std::unique_lock lock(mu_);
  work_cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
  if (queue_.empty()) return false;
  in_flight_seq_ = queue_.front().seq;
  size_t taken = 0;
  while (!queue_.empty() && (out->empty() || taken + queue_.front().bytes <= max_batch_bytes)) {
    taken += queue_.front().bytes;
    queued_bytes_ -= queue_.front().bytes;
    out->push_back(std::move(queue_.front().write));
    queue_.pop_front();
  }
  return true;
}

void KvWriteQueue::MarkDone() {
  {
    std::lock_guard lock(mu_);
    in_flight_seq_ = 0;
  }
  resolved_cv_.notify_all();
}

void KvWriteQueue::WaitResolved() {
  std::unique_lock lock(mu_);
  const uint64_t target = next_seq_ - 1;
  resolved_cv_.wait(lock, [&] {
    return (queue_.empty() || queue_.front().seq > target) &&
           (in_flight_seq_ == 0 || in_flight_seq_ > target);
  });
}

void KvWriteQueue::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  work_cv_.notify_all();
}

KvWriteQueue::Stats KvWriteQueue::stats() const {
  std::lock_guard lock(mu_);
  return {queue_.size(), queued_bytes_, dropped_writes_, dropped_bytes_};
}

}  // namespace agentkv::store
