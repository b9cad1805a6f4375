// DeferredWriteBackend: a test double around a real backend (the CPU one)
// whose StartWriteBlocks behaves like a device's asynchronous copy. The
// copy lands in the wrapped backend's KV before any later call that
// touches blocks (as stream order does on a GPU), but the ticket is only
// reported done after `done_after_polls` non-waiting WriteDone calls (or a
// waiting one): until then the caller must keep the source untouched. The
// double checks that it did: it keeps a copy of each source and counts
// the checks that found a write's source changed before its ticket was
// reported done (source_changes(); each write is checked when it lands and
// when reported done), i.e. a source the caller let go of too early.
//
// Failures can be injected: the next StartWriteBlocks fails, the next
// ticket reported done reports an error instead, the next
// ReadKeptLogits fails, or host buffers of one size cannot be had. The
// sizes of the host buffers asked for are recorded.
//
// Thread-safety: as Backend (one thread).
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/backend/backend.h"

namespace agentkv::testing {

class DeferredWriteBackend : public backend::Backend {
 public:
  explicit DeferredWriteBackend(std::unique_ptr<backend::Backend> inner, int done_after_polls = 3)
      : inner_(std::move(inner)), done_after_polls_(done_after_polls) {}

  // Observations and knobs.
  int64_t source_changes() const { return source_changes_; }
  size_t writes_pending() const { return pending_.size(); }
  int64_t writes_started() const { return started_; }
  void set_done_after_polls(int n) { done_after_polls_ = n; }
  void FailNextStart() { fail_start_ = true; }
  void FailNextDone() { fail_done_ = true; }
  // The next ReadKeptLogits fails.
  void FailNextReadKeptLogits() { fail_read_kept_ = true; }
  // AllocateHostBuffer of exactly `bytes` fails (ResourceExhausted).
  void FailHostBuffersOf(size_t bytes) { fail_host_bytes_ = bytes; }
  // Every AllocateHostBuffer size asked for, in order.
  const std::vector<size_t>& host_buffer_requests() const { return host_requests_; }

  const model::ModelConfig& config() const override { return inner_->config(); }
  const cache::ModelCacheSpec& cache_spec() const override { return inner_->cache_spec(); }
  std::string name() const override { return inner_->name(); }
  std::string kv_format() const override { return inner_->kv_format(); }
  uint32_t kv_element_size() const override { return inner_->kv_element_size(); }
  Result<uint64_t> FreeMemoryBytes() const override { return inner_->FreeMemoryBytes(); }
  double default_kv_memory_fraction() const override {
    return inner_->default_kv_memory_fraction();
  }
  Status AllocateKv(const backend::KvLayout& layout) override {
    RETURN_IF_ERROR(Land());
    return inner_->AllocateKv(layout);
  }
  const backend::KvLayout& kv_layout() const override { return inner_->kv_layout(); }
  int default_step_tokens() const override { return inner_->default_step_tokens(); }
  Status Reserve(int max_step_tokens, int max_batch) override {
    return inner_->Reserve(max_step_tokens, max_batch);
  }
  Status CopyBlocks(std::span<const cache::KvBlockCopy> copies) override {
    RETURN_IF_ERROR(Land());
    return inner_->CopyBlocks(copies);
  }
  Status Forward(std::span<const backend::SeqStep> batch, std::span<float> logits) override {
    RETURN_IF_ERROR(Land());
    return inner_->Forward(batch, logits);
  }
  using backend::Backend::ForwardSampled;
  using backend::Backend::LaunchStep;
  Status ForwardSampled(std::span<const backend::SeqStep> batch,
                        std::span<const backend::RowPick> rows, std::span<int32_t> tokens,
                        std::span<float> logits) override {
    RETURN_IF_ERROR(Land());
    return inner_->ForwardSampled(batch, rows, tokens, logits);
  }
  Status LaunchStep(std::span<const backend::SeqStep> batch, std::span<const backend::RowPick> rows,
                    std::span<float> logits) override {
    RETURN_IF_ERROR(Land());
    return inner_->LaunchStep(batch, rows, logits);
  }
  Status CollectStep(std::span<int32_t> picks) override { return inner_->CollectStep(picks); }
  // Kept logits rows as the wrapped backend keeps them (its picks are on
  // the host: picks_on_device stays false).
  bool reads_kept_logits() const override { return inner_->reads_kept_logits(); }
  bool reads_kept_logits_in_flight() const override {
    return inner_->reads_kept_logits_in_flight();
  }
  Status ReadKeptLogits(std::span<const int32_t> rows, std::span<float> logits) override {
    if (fail_read_kept_) {
      fail_read_kept_ = false;
      return IoError("injected: reading kept logits failed");
    }
    return inner_->ReadKeptLogits(rows, logits);
  }
  int steps_in_flight() const override { return inner_->steps_in_flight(); }
  Status ReadBlock(int group, int32_t block, std::span<std::byte> out) override {
    RETURN_IF_ERROR(Land());
    return inner_->ReadBlock(group, block, out);
  }
  Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) override {
    RETURN_IF_ERROR(Land());
    return inner_->WriteBlock(group, block, in);
  }
  Status ReadBlocks(int group, std::span<const int32_t> blocks, std::span<std::byte> out) override {
    RETURN_IF_ERROR(Land());
    return inner_->ReadBlocks(group, blocks, out);
  }
  Result<uint64_t> StartReadBlocks(int group, std::span<const int32_t> blocks,
                                   std::span<std::byte> out) override {
    RETURN_IF_ERROR(Land());
    return inner_->StartReadBlocks(group, blocks, out);
  }
  Result<bool> ReadDone(uint64_t ticket, bool wait) override {
    return inner_->ReadDone(ticket, wait);
  }
  Status WriteBlocks(int group, std::span<const int32_t> blocks,
                     std::span<const std::byte> in) override {
    RETURN_IF_ERROR(Land());
    return inner_->WriteBlocks(group, blocks, in);
  }
  Result<uint64_t> StartWriteBlocks(int group, std::span<const int32_t> blocks,
                                    std::span<const std::byte> in) override {
    if (fail_start_) {
      fail_start_ = false;
      return Internal("injected StartWriteBlocks failure");
    }
    // Checked now, as a device backend does: an error leaves nothing pending.
    if (group < 0 || group >= static_cast<int>(cache_spec().groups.size()))
      return InvalidArgument("StartWriteBlocks: group out of range");
    const size_t n = cache_spec().BytesPerBlock(group, kv_layout().block_size);
    if (in.size() != n * blocks.size())
      return InvalidArgument("StartWriteBlocks: buffer size mismatch");
    for (int32_t b : blocks)
      if (b < 0 || b >= kv_layout().blocks_per_group[group])
        return InvalidArgument("StartWriteBlocks: block out of range");
    Pending p;
    p.ticket = next_ticket_++;
    p.group = group;
    p.blocks.assign(blocks.begin(), blocks.end());
    p.source = in;
    p.snapshot.assign(in.begin(), in.end());
    p.polls_left = done_after_polls_;
    pending_.push_back(std::move(p));
    ++started_;
    return pending_.back().ticket;
  }
  Result<bool> WriteDone(uint64_t ticket, bool wait) override {
    if (ticket >= next_ticket_) return InvalidArgument("WriteDone: unknown ticket");
    if (ticket <= done_) return true;
    if (!wait) {
      // The ticket's own countdown (earlier ones finish no later).
      for (Pending& p : pending_)
        if (p.ticket == ticket && --p.polls_left > 0) return false;
    }
    RETURN_IF_ERROR(Land());
    while (!pending_.empty() && pending_.front().ticket <= ticket) {
      Pending& p = pending_.front();
      CheckSource(p);
      pending_.pop_front();
    }
    done_ = ticket;
    if (fail_done_) {
      fail_done_ = false;
      return Internal("injected WriteDone failure");
    }
    return true;
  }
  double device_seconds() const override { return inner_->device_seconds(); }
  Result<backend::HostBuffer> AllocateHostBuffer(size_t bytes) override {
    host_requests_.push_back(bytes);
    if (fail_host_bytes_ && *fail_host_bytes_ == bytes)
      return ResourceExhausted("injected host buffer failure");
    return inner_->AllocateHostBuffer(bytes);
  }

 private:
  struct Pending {
    uint64_t ticket = 0;
    int group = 0;
    std::vector<int32_t> blocks;
    std::span<const std::byte> source;
    std::vector<std::byte> snapshot;  // the source's bytes at the start
    bool landed = false;
    int polls_left = 0;
  };
  void CheckSource(const Pending& p) {
    if (std::memcmp(p.source.data(), p.snapshot.data(), p.snapshot.size()) != 0) ++source_changes_;
  }
  // Copies every pending write not landed yet into the KV, in order, from
  // its source as it is now (a DMA reads it when it runs).
  Status Land() {
    for (Pending& p : pending_) {
      if (p.landed) continue;
      CheckSource(p);
      RETURN_IF_ERROR(inner_->WriteBlocks(p.group, p.blocks, p.source));
      p.landed = true;
    }
    return Status::Ok();
  }

  std::unique_ptr<backend::Backend> inner_;
  int done_after_polls_;
  std::deque<Pending> pending_;
  uint64_t next_ticket_ = 1;
  uint64_t done_ = 0;
  int64_t started_ = 0;
  int64_t source_changes_ = 0;
  bool fail_start_ = false;
  bool fail_done_ = false;
  bool fail_read_kept_ = false;
  std::optional<size_t> fail_host_bytes_;
  std::vector<size_t> host_requests_;
};

}  // namespace agentkv::testing
