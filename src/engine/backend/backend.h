// Backend: the forward pass over a batch of sequences with paged KV.
//
// A step runs any mix of prefill chunks and decode tokens: each SeqStep gives
// a sequence's new tokens, how many of its tokens are already in the KV cache
// (start_pos), and one block table per cache group (ModelCacheSpec::groups).
// Full-attention groups index the table by logical block; sliding groups are
// rings indexed by logical block % RingBlocks. The backend writes the new
// tokens' K and V into those blocks; the caller (scheduler / cache manager)
// owns which blocks those are and must have made them exclusive (copy-on-write
// done through CopyBlocks with the manager's KvBlockCopy list) before the
// step.
//
// Thread-safety: a backend is owned by one engine thread; no method may be
// called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "cache/model_cache_spec.h"
#include "engine/backend/row_logprobs.h"
#include "engine/backend/row_pick.h"
#include "engine/model/model_config.h"
#include "util/status.h"
#include "util/system_memory.h"

namespace agentkv::backend {

inline constexpr int kMaxCacheGroups = 4;

// Host memory from Backend::AllocateHostBuffer: plain memory on the CPU,
// page-locked (pinned) on a GPU so that copies to the device run at full
// speed and asynchronously. Move-only; frees itself. Any thread may read and
// write the bytes; only the owning backend's thread may free it (it is freed
// through the backend's allocator).
class HostBuffer {
 public:
  using Free = void (*)(std::byte*);
  HostBuffer() = default;
  HostBuffer(std::byte* data, size_t size, Free free) : data_(data, free), size_(size) {}
  std::span<std::byte> span() const { return {data_.get(), size_}; }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte, Free> data_{nullptr, [](std::byte*) {}};
  size_t size_ = 0;
};

struct SeqStep {
  std::span<const int32_t> tokens;  // new tokens this step, at least one
  int32_t start_pos = 0;            // tokens of this sequence already cached
  std::array<std::span<const int32_t>, kMaxCacheGroups> block_tables{};
  bool want_logits = false;  // logits of the last new token
  // With want_logits: logits (and picks) of the last `logit_rows` new
  // tokens, one row each in token order (speculative verification: the
  // last real token and the draft after it). 1..tokens.size(); more than 1
  // only where the backend's multi_logit_rows(), and never with prev_row.
  int32_t logit_rows = 1;
  // >= 0 (LaunchStep only): the last of `tokens` is not read; the step uses
  // instead the pick of want_logits row `prev_row` (a kGreedy or kDevice
  // row) of the step launched just before it, which may still be running.
  int32_t prev_row = -1;
};

// Logits rows the step produces: logit_rows with want_logits, else none.
inline int32_t LogitRows(const SeqStep& s) { return s.want_logits ? s.logit_rows : 0; }

struct KvLayout {
  int block_size = 16;
  std::array<int32_t, kMaxCacheGroups> blocks_per_group{};
};

// Validates a Forward batch against the model and the KV layout: every step
// has tokens inside the vocabulary and a block table per group long enough
// for its positions, with block ids inside the pool. Shared by the backends.
// prev_row is refused unless `allow_prev_row` (then the last token of such a
// step is not checked: the caller substitutes it); logit_rows > 1 is
// Unimplemented unless `allow_multi_rows`, and out of range always refused.
Status CheckSteps(std::span<const SeqStep> batch, const model::ModelConfig& config,
                  const cache::ModelCacheSpec& spec, const KvLayout& layout,
                  bool allow_prev_row = false, bool allow_multi_rows = false);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const model::ModelConfig& config() const = 0;
  virtual const cache::ModelCacheSpec& cache_spec() const = 0;
  virtual std::string name() const = 0;
  // The KV cache element type as stored by ReadBlock ("f32", "bf16"): part
  // of the fingerprint persisted KV is tagged with.
  virtual std::string kv_format() const { return "f32"; }
  // Bytes of one KV element (the store's shuffle width).
  virtual uint32_t kv_element_size() const { return 4; }

  // The plan the uint8_t shorthands below stand for.
  static std::vector<RowPick> GreedyRows(std::span<const uint8_t> greedy_rows) {
    std::vector<RowPick> rows(greedy_rows.size());
    for (size_t r = 0; r < rows.size(); ++r)
      rows[r].mode = greedy_rows[r] ? PickMode::kGreedy : PickMode::kHost;
    return rows;
  }

  // Memory a KV pool of unspecified size is carved from, measured now (call
  // it once weights and workspaces exist): a GPU's free device memory; the
  // host's available memory for backends that keep KV in host memory.
  virtual Result<uint64_t> FreeMemoryBytes() const { return AvailableHostMemoryBytes(); }
  // The share of FreeMemoryBytes() the KV pool takes by default. Host
  // memory is shared with everything else on the machine (the host KV tier,
  // the store's page cache, other programs), so a CPU backend takes a
  // quarter; a GPU is the server's own.
  virtual double default_kv_memory_fraction() const { return 0.25; }

  // (Re)allocates the KV storage; all previous KV content is lost.
  virtual Status AllocateKv(const KvLayout& layout) = 0;
  virtual const KvLayout& kv_layout() const = 0;

  // The tokens per step an engine schedules unless told otherwise
  // (EngineOptions): what the device handles best.
  virtual int default_step_tokens() const { return 2048; }
  // Prepares for steps of up to `max_step_tokens` tokens and `max_batch`
  // sequences: sizes workspaces and does the one-time work such steps would
  // otherwise do when they first run (a device backend: GEMM set-up, decode
  // graph capture), so that serving does not pay for it. Requires
  // AllocateKv; again after each AllocateKv. Optional: Forward still grows
  // what a step needs. ResourceExhausted when the device cannot hold the
  // workspaces.
  virtual Status Reserve(int /*max_step_tokens*/, int /*max_batch*/) { return Status::Ok(); }

  // Copies whole blocks (every layer of the group), in order.
  virtual Status CopyBlocks(std::span<const cache::KvBlockCopy> copies) = 0;

  // Whether steps may ask for several logits rows per sequence
  // (SeqStep::logit_rows > 1, speculative verification). A backend without
  // it refuses such steps (Unimplemented); the engine then never drafts.
  virtual bool multi_logit_rows() const { return false; }

  // Runs one step. `logits` receives vocab_size floats for each logits row
  // (LogitRows of each SeqStep), in batch order; it must hold at least that
  // many. "Row r" below counts these rows.
  virtual Status Forward(std::span<const SeqStep> batch, std::span<float> logits) = 0;

  // Forward with the picking each row's RowPick asks for (engine/backend/row_pick.h),
  // so that a device backend need not copy the logits of rows it picks
  // itself. For the r-th SeqStep with want_logits, rows[r] says:
  //   kGreedy: tokens[r] receives the argmax of its logits (lowest id on
  //     ties, NaN never wins: as Sampler's greedy pick);
  //   kDevice: tokens[r] receives SampleDraw(logits, rows[r].sample)
  //     (engine/backend/sample_draw.h; a GPU computes the same draw on the device);
  //   kHost (or r beyond rows): logits row r is filled as Forward does.
  // Logits rows of kGreedy and kDevice rows are left unspecified. tokens
  // holds one entry per row. The default runs Forward and picks on the host
  // with the CPU reference functions, so every backend serves the same plan.
  virtual Status ForwardSampled(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                                std::span<int32_t> tokens, std::span<float> logits);
  // Shorthand: greedy_rows[r] non-zero = kGreedy, zero = kHost.
  Status ForwardSampled(std::span<const SeqStep> batch, std::span<const uint8_t> greedy_rows,
                        std::span<int32_t> tokens, std::span<float> logits) {
    const std::vector<RowPick> rows = GreedyRows(greedy_rows);
    return ForwardSampled(batch, rows, tokens, logits);
  }

  // Pipelined steps, so that the host prepares step N + 1 while the device
  // runs step N. LaunchStep starts a step as ForwardSampled would and may
  // return before it has run; CollectStep waits for the oldest launched step
  // not yet collected and writes its picks (one per want_logits row, as
  // ForwardSampled's `tokens`; kHost rows' picks are left unspecified and
  // their logits go to `logits`, which must stay valid and untouched until
  // the step is collected; from AllocateHostBuffer memory a device backend
  // copies into it asynchronously and at full speed, into other memory the
  // copy may hold up the call). Steps run in launch order; at most
  // kMaxStepsInFlight are launched and not collected (Internal
  // beyond). `batch` and `rows` are read during the call only. A SeqStep's
  // prev_row names a kGreedy or kDevice row of the step launched just
  // before, with no Forward or ForwardSampled in between. An error from
  // LaunchStep means the step did not start; from CollectStep, that its
  // picks are unusable. The default runs ForwardSampled inside LaunchStep.
  static constexpr int kMaxStepsInFlight = 2;
  virtual Status LaunchStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                            std::span<float> logits);
  // Shorthand as for ForwardSampled.
  Status LaunchStep(std::span<const SeqStep> batch, std::span<const uint8_t> greedy_rows,
                    std::span<float> logits) {
    const std::vector<RowPick> rows = GreedyRows(greedy_rows);
    return LaunchStep(batch, rows, logits);
  }
  virtual Status CollectStep(std::span<int32_t> picks);
  // Whether the picks come with logprobs: for the kGreedy / kDevice rows
  // whose RowPick::logprobs >= 0, CollectStep (and ForwardSampled) also
  // deliver the row's RowLogprobs (engine/backend/row_logprobs.h, computed
  // where the logits are), so the engine may plan such rows off the host
  // (PlanRowPick). The default LaunchStep / CollectStep over the default
  // ForwardSampled compute them with ComputeRowLogprobs; a backend says true
  // only when the paths it uses do.
  virtual bool picks_logprobs() const { return false; }
  // The logprobs of the step CollectStep (or ForwardSampled) gave last: one
  // entry per want_logits row; count -1 for rows that asked none. Valid
  // until the next ForwardSampled, LaunchStep or CollectStep.
  virtual std::span<const RowLogprobs> collected_logprobs() const { return collected_logprobs_; }
  // Steps launched and not collected yet.
  virtual int steps_in_flight() const { return static_cast<int>(launched_.size()); }
  // Whether ReadKeptLogits works (RowPick::keep_logits is honoured). A
  // backend without it may ignore keep_logits; the engine then picks
  // constrained rows on the host (kHost).
  virtual bool reads_kept_logits() const { return false; }
  // Whether kGreedy / kDevice rows are picked off the host (on a GPU), so
  // that a pick costs the host's threads nothing.
  virtual bool picks_on_device() const { return false; }
  // Writes the logits of want_logits rows `rows` (each a kGreedy / kDevice
  // row with RowPick::keep_logits) of the step CollectStep gave last into
  // `logits` (row r at r * vocab_size: where a kHost row would have gone).
  // Requires: that step was the last one launched (no LaunchStep, Forward or
  // ForwardSampled since; the device's logits buffer is reused by every
  // step) and has been collected, or, where reads_kept_logits_in_flight,
  // the one before the last launched (see there). Fastest into AllocateHostBuffer memory
  // (pinned on a GPU). Internal otherwise; InvalidArgument for a row out
  // of range or `logits` too small. The default: Unimplemented.
  virtual Status ReadKeptLogits(std::span<const int32_t> rows, std::span<float> logits);
  // Whether ReadKeptLogits also reads the kept rows of the step CollectStep
  // gave last while the one step launched after it is still in flight
  // (pipelined steps with optimistically picked constrained rows), provided
  // that later step was launched with a `logits` span that does not overlap
  // the collected step's, and `logits` is the collected step's span. False
  // by default: the later launch reuses the buffer the kept rows are in.
  virtual bool reads_kept_logits_in_flight() const { return false; }

  // Raw access to one whole block of group `group` (every layer of the group,
  // ModelCacheSpec::BytesPerBlock bytes) for persistence and swapping. The
  // byte layout is the backend's cache layout, identical across backends:
  // for each layer of the group, K then V, each [block_size][kv_heads][head_dim]
  // in the cache dtype.
  virtual Status ReadBlock(int group, int32_t block, std::span<std::byte> out) = 0;
  virtual Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) = 0;
  // Reads blocks[i] of group `group` into out[i * BytesPerBlock ...], for
  // all i, in one go (a device backend batches the copies). The default
  // calls ReadBlock for each.
  virtual Status ReadBlocks(int group, std::span<const int32_t> blocks, std::span<std::byte> out) {
    const size_t n = blocks.empty() ? 0 : out.size() / blocks.size();
    if (n * blocks.size() != out.size()) return InvalidArgument("ReadBlocks: buffer size mismatch");
    for (size_t i = 0; i < blocks.size(); ++i)
      RETURN_IF_ERROR(ReadBlock(group, blocks[i], out.subspan(i * n, n)));
    return Status::Ok();
  }
  // Starts reading blocks[i] into out[i * BytesPerBlock ...] and returns a
  // ticket for ReadDone. The reads are ordered after every Forward issued
  // before the call and before every one issued after it, so they see the
  // blocks as they are now even if a later step writes them. `out` must
  // stay valid and untouched until ReadDone reports the ticket done (from
  // AllocateHostBuffer memory a device backend copies asynchronously). On
  // an error nothing is pending. The default reads synchronously.
  virtual Result<uint64_t> StartReadBlocks(int group, std::span<const int32_t> blocks,
                                           std::span<std::byte> out) {
    RETURN_IF_ERROR(ReadBlocks(group, blocks, out));
    return uint64_t{0};
  }
  // Whether the reads of `ticket` (and of every earlier ticket) are done;
  // with `wait`, returns once they are. An error means their bytes are
  // unusable.
  virtual Result<bool> ReadDone(uint64_t /*ticket*/, bool /*wait*/) { return true; }
  // Writes in[i * BytesPerBlock ...] into blocks[i] for all i and returns
  // when the data is in place. Fastest from AllocateHostBuffer memory. The
  // default calls WriteBlock for each, stopping at the first error.
  virtual Status WriteBlocks(int group, std::span<const int32_t> blocks,
                             std::span<const std::byte> in) {
    const size_t n = blocks.empty() ? 0 : in.size() / blocks.size();
    if (n * blocks.size() != in.size()) return InvalidArgument("WriteBlocks: buffer size mismatch");
    for (size_t i = 0; i < blocks.size(); ++i)
      RETURN_IF_ERROR(WriteBlock(group, blocks[i], in.subspan(i * n, n)));
    return Status::Ok();
  }
  // Starts writing in[i * BytesPerBlock ...] into blocks[i] for all i and
  // returns a ticket for WriteDone, without waiting for the copies. They
  // are ordered after every backend call issued before (so a read started
  // earlier still sees the old bytes) and before every one issued after it
  // (a later step, block copy or read sees the new bytes): the caller need
  // not wait before using the blocks. What it must wait for is `in`: it
  // has to stay valid and unchanged until WriteDone reports the ticket done
  // (from AllocateHostBuffer memory a device backend copies
  // asynchronously). On an error nothing of this call is pending (earlier
  // tickets still are). The default writes synchronously (WriteBlocks) and
  // returns a ticket that is done at once.
  virtual Result<uint64_t> StartWriteBlocks(int group, std::span<const int32_t> blocks,
                                            std::span<const std::byte> in) {
    RETURN_IF_ERROR(WriteBlocks(group, blocks, in));
    return uint64_t{0};
  }
  // Whether the writes of `ticket` (and of every earlier ticket) are done,
  // so their sources may be reused; with `wait`, returns once they are. An
  // error means the blocks may not hold the bytes (the sources are free).
  virtual Result<bool> WriteDone(uint64_t /*ticket*/, bool /*wait*/) { return true; }
  // Seconds the device spent on forward passes so far, from the start of
  // each pass's input copy to the end of its last kernel, as the device's
  // own clock measures it (0 where there is no device).
  virtual double device_seconds() const { return 0; }
  // Host seconds spent capturing and instantiating step graphs, and how many
  // were captured (0 for backends without graphs). The device is idle
  // meanwhile, so device_seconds() includes this time.
  virtual double graph_capture_seconds() const { return 0; }
  virtual int64_t graphs_captured() const { return 0; }
  // Steps run by replaying a captured graph so far (0 for backends without
  // graphs). graphs_captured() counts captures, which happen once per batch
  // bucket (at Reserve, or when a workspace grows), so a run over captured
  // graphs adds none: this says whether its steps used them.
  virtual int64_t graph_steps() const { return 0; }
  // `bytes` of host memory suited to WriteBlocks / ReadBlocks. Call it
  // outside hot paths: pinning memory is slow.
  virtual Result<HostBuffer> AllocateHostBuffer(size_t bytes) {
    auto* p = new (std::nothrow) std::byte[bytes];
    if (p == nullptr && bytes > 0) {
      return ResourceExhausted("cannot allocate " + std::to_string(bytes) +
                               " bytes of host memory");
    }
    return HostBuffer(p, bytes, [](std::byte* q) { delete[] q; });
  }

 private:
  // The default LaunchStep / CollectStep: picks of the steps run and not
  // collected yet, oldest first, and those of the last step launched.
  std::deque<std::vector<int32_t>> launched_;
  std::vector<int32_t> last_picks_;
  // The default ForwardSampled's logprobs, and those of the steps launched
  // and not collected (parallel to launched_).
  std::vector<RowLogprobs> sampled_logprobs_;
  std::deque<std::vector<RowLogprobs>> launched_logprobs_;
  // The logits span of each step the default LaunchStep ran and that is not
  // collected (parallel to launched_), and the rows and span of the step
  // CollectStep gave last (rows -1: none, or a Forward / ForwardSampled
  // outside LaunchStep came after it), for KeptLogitsInPlace.
  std::deque<std::span<float>> launched_logits_;
  int64_t collected_rows_ = -1;
  std::span<float> collected_logits_;

 protected:
  // What collected_logprobs() returns by default.
  std::vector<RowLogprobs> collected_logprobs_;
  // ReadKeptLogits for a backend on the default LaunchStep / ForwardSampled,
  // which leave every row's logits in the `logits` the step was launched
  // with (keep_logits rows drawn from a copy): checks the requirements and
  // copies nothing.
  Status KeptLogitsInPlace(std::span<const int32_t> rows, std::span<float> logits) const;
  // For such a backend's Forward: the rows of the last step launched are
  // no longer the ones in place.
  void ForgetKeptLogits() { collected_rows_ = -1; }
};

}  // namespace agentkv::backend
