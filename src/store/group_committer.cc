#include "store/group_committer.h"

#include <algorithm>
#include <chrono>

namespace agentkv::store {

Status GroupCommitter::Commit(const std::function<Status(LmdbEnv::WriteTxn&)>& apply) {
  const auto t0 = std::chrono::steady_clock::now();
  busy_.fetch_add(1, std::memory_order_relaxed);
  Request me{&apply, Status::Ok(), false};
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back(&me);
  cv_.wait(lock, [&] { return me.done || !leading_; });
  if (!me.done) {
    // Leader: everything queued so far (this request included) goes in one
    // transaction; later arrivals queue for the next leader.
    leading_ = true;
    std::deque<Request*> group;
    group.swap(queue_);
    lock.unlock();
    CommitGroup(group);
    lock.lock();
    for (Request* r : group) r->done = true;
    ++stats_.transactions;
    leading_ = false;
    cv_.notify_all();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.requests;
  stats_.wait_seconds += waited;
  stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, waited);
  busy_.fetch_sub(1, std::memory_order_relaxed);
  return me.status;
}

void GroupCommitter::CommitGroup(const std::deque<Request*>& group) {
  Status s = env_->Write([&](LmdbEnv::WriteTxn& t) -> Status {
    for (Request* r : group) RETURN_IF_ERROR((*r->apply)(t));
    return Status::Ok();
  });
  if (s.ok() || group.size() == 1) {
    for (Request* r : group) r->status = s;
    return;
  }
  // One request may have failed the whole group: each alone decides.
  for (Request* r : group) {
    r->status = env_->Write(*r->apply);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.transactions;
  }
}

GroupCommitter::Stats GroupCommitter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace agentkv::store
