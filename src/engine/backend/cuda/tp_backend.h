// TpBackend: one model over the N GPUs of a host (tensor parallelism,
// docs/tensor-parallel.md). A Backend to the engine exactly as CudaBackend
// is (one scheduler, one prefix cache, the global ModelCacheSpec and block
// tables, the single-GPU block layout for the host tier and the store);
// underneath, N CudaBackend ranks, each built for TpPlan::RankConfig with
// its cut of the weights (TpWeightSource) on its own GPU, worker thread and
// streams, joined by one NCCL communicator each (NcclComms).
//
// Steps: every rank runs the same step (the same plan, the same sizes, the
// same collectives in the same order, from its own thread; its decode
// graphs hold its all-reduces).
// - Steps whose rows are all kGreedy without logprobs run as on one GPU:
//   every rank ends the step with the global argmax on the device (one
//   max all-reduce of argmax keys), the next step's embedding reads it
//   there, and nothing but the picks comes back.
// - Any other step (kHost rows, kDevice draws, logprobs) gathers the
//   logits of its rows: each rank copies its vocabulary slice to the host,
//   the slices are laid side by side, and the picks are made there with
//   the CPU reference functions (Backend::ForwardSampled's). A step naming
//   such a step's pick (prev_row) waits for it and reads the pick on the
//   host. picks_logprobs() is false: the engine computes logprobs from
//   those logits.
// Blocks: reads merge the primary holders' heads into the single-GPU
// layout, writes split it to every holder (TpKvRuns), so a stored agent
// resumes at any degree; the fingerprint (config, KV format) does not
// depend on the degree.
//
// All-reduce buffers: with options.nccl.symmetric_windows (the default),
// every rank has one NcclWindows window, registered from this thread in
// one NCCL group, holding views of its residual stream (and a
// sandwich-norm model's o output) for the steps whose all-reduces are
// small enough to run faster from it (TpReduceFromWindow: decode steps of
// few sequences); larger steps sum from each rank's own buffers
// (CudaBackend::SetReduceArena). The window is sized for those steps
// (CudaBackend::ReduceWindowBytes, for the step capacity: AllocateKv the
// rank options' limits, Reserve the engine's; none where even one token's
// sum is larger). If windows cannot be made (NCCL before 2.27, no CUDA
// VMM, a registration error), every rank keeps plain buffers, once said
// on stderr; a step that grows a rank's capacity past what the window
// holds drops every rank's views alike until the next Reserve. Where the
// NCCL loaded starts its symmetric kernels without waiting for the kernel
// before them (TpWindowReduceNeedsFence: 2.28.0 to 2.30.6 on Hopper), each
// all-reduce from a window is preceded by a fence kernel, said once on
// stderr.
//
// Errors: an error from a rank mid-step may leave the others waiting in a
// collective; the backend then refuses every later step (the first error
// is returned again).
//
// Thread-safety: as Backend; one thread at a time. Owns the ranks, their
// threads and the communicators.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/nccl_windows.h"
#include "engine/backend/tp_plan.h"
#include "engine/backend/tp_reduce_plan.h"

namespace agentkv::backend::cuda {

struct TpBackendOptions {
  int degree = 2;           // GPUs 0 .. degree - 1
  CudaBackendOptions rank;  // every rank's (device and tp fields set per rank)
  cuda::NcclOptions nccl;
};

class TpBackend final : public Backend {
 public:
  // Checks the split (TpPlan::Make against the visible GPUs) before
  // loading anything, then builds the ranks in parallel.
  static Result<std::unique_ptr<TpBackend>> Create(const model::ModelConfig& config,
                                                   const model::WeightSource& weights,
                                                   const TpBackendOptions& options);
  ~TpBackend() override;

  const model::ModelConfig& config() const override { return config_; }
  const cache::ModelCacheSpec& cache_spec() const override { return spec_; }
  std::string name() const override { return "cuda"; }
  std::string kv_format() const override { return cache::KvDtypeName(spec_.kv_dtype); }
  uint32_t kv_element_size() const override {
    return static_cast<uint32_t>(cache::KvDtypeBytes(spec_.kv_dtype));
  }
  const TpPlan& plan() const { return plan_; }
  // Whether the ranks' steps of few tokens sum from symmetric windows now,
  // and if windows were asked for and could not be made, why.
  bool residual_in_window() const { return ranks_[0]->residual_in_window(); }
  const std::string& windows_refused() const { return windows_refused_; }
  // Whether the all-reduces from the windows are preceded by a fence
  // kernel now (TpWindowReduceNeedsFence for the NCCL loaded).
  bool reduce_fenced() const { return ranks_[0]->reduce_fenced(); }
  // Steps launched so far whose all-reduces ran from the windows, and from
  // plain buffers (rank 0's; every rank runs the same steps).
  int64_t window_reduce_steps() const { return ranks_[0]->window_reduce_steps(); }
  int64_t plain_reduce_steps() const { return ranks_[0]->plain_reduce_steps(); }

  // The smallest free memory of the ranks, in bytes of the single-GPU
  // layout (scaled by all heads over a rank's heads), so that the engine's
  // pool sizing, which divides by the global block size, fills every GPU.
  Result<uint64_t> FreeMemoryBytes() const override;
  double default_kv_memory_fraction() const override;
  int default_step_tokens() const override;
  Status AllocateKv(const KvLayout& layout) override;
  Status Reserve(int max_step_tokens, int max_batch) override;
  const KvLayout& kv_layout() const override { return layout_; }
  Status CopyBlocks(std::span<const cache::KvBlockCopy> copies) override;
  Status Forward(std::span<const SeqStep> batch, std::span<float> logits) override;
  using Backend::ForwardSampled;
  using Backend::LaunchStep;
  Status ForwardSampled(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                        std::span<int32_t> tokens, std::span<float> logits) override;
  Status LaunchStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                    std::span<float> logits) override;
  Status CollectStep(std::span<int32_t> picks) override;
  int steps_in_flight() const override { return static_cast<int>(in_flight_.size()); }
  Status ReadBlock(int group, int32_t block, std::span<std::byte> out) override;
  Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) override;
  Status ReadBlocks(int group, std::span<const int32_t> blocks, std::span<std::byte> out) override;
  Status WriteBlocks(int group, std::span<const int32_t> blocks,
                     std::span<const std::byte> in) override;
  // The ranks' reads into staging of their own; ReadDone merges them into
  // `out` once every rank's is done.
  Result<uint64_t> StartReadBlocks(int group, std::span<const int32_t> blocks,
                                   std::span<std::byte> out) override;
  Result<bool> ReadDone(uint64_t ticket, bool wait) override;
  // Splits `in` at once (it may be reused when this returns); WriteDone
  // tells when every rank's copy is done.
  Result<uint64_t> StartWriteBlocks(int group, std::span<const int32_t> blocks,
                                    std::span<const std::byte> in) override;
  Result<bool> WriteDone(uint64_t ticket, bool wait) override;
  Result<HostBuffer> AllocateHostBuffer(size_t bytes) override;

  // Rank 0's (every rank runs the same steps).
  double device_seconds() const override;
  double graph_capture_seconds() const override;
  int64_t graphs_captured() const override;
  int64_t graph_steps() const override;

 private:
  class Workers;
  struct Step;
  struct Transfer;
  TpBackend(const model::ModelConfig& config, const TpBackendOptions& options, TpPlan plan);
  // Runs fn(rank) on every rank's thread at once; the first error.
  Status RunAll(const std::function<Status(int)>& fn) const;
  // Settles the steps in flight up to and including `step` (oldest first):
  // collects them from the ranks and makes their picks.
  Status SettleThrough(const Step* step);
  Status Settle(Step& s);
  // Checks a batched block access; the global bytes per block.
  Result<size_t> CheckBlocks(const char* what, int group, std::span<const int32_t> blocks,
                             size_t buffer_bytes) const;
  // Windows for a step capacity of `tokens` tokens (grown, never shrunk:
  // room for the steps that sum from them) given to every rank; on
  // failure, plain buffers for good (windows_refused_).
  Status EnsureWindows(int64_t tokens);
  // Pinned staging of at least `bytes` for rank r (from its free list, or
  // new), and its return.
  Result<HostBuffer> TakeStaging(int r, size_t bytes);
  void ReturnStaging(int r, HostBuffer b);

  model::ModelConfig config_;
  cache::ModelCacheSpec spec_;
  TpBackendOptions options_;
  TpPlan plan_;
  KvLayout layout_;
  std::vector<cache::ModelCacheSpec> rank_specs_;
  // Per rank and cache group: the runs between the two block layouts.
  std::vector<std::vector<std::vector<TpKvRun>>> runs_;
  std::unique_ptr<Workers> workers_;
  std::unique_ptr<cuda::NcclComms> comms_;
  std::unique_ptr<cuda::NcclWindows> windows_;  // (after comms_: destroyed before it)
  int64_t window_tokens_ = 0;
  std::string windows_refused_;
  bool reduce_fence_ = false;  // decided with the first window
  std::vector<std::unique_ptr<CudaBackend>> ranks_;
  mutable Status failed_;  // the first error a step left the ranks in

  std::vector<std::shared_ptr<Step>> in_flight_;       // oldest first
  std::shared_ptr<Step> last_;                         // the last step launched
  std::vector<float> full_logits_;                     // host-mode steps' gathered rows
  std::vector<std::vector<HostBuffer>> staging_free_;  // per rank
  std::vector<std::unique_ptr<Transfer>> transfers_;   // reads and writes in flight
  uint64_t next_read_ticket_ = 1, next_write_ticket_ = 1;
};

}  // namespace agentkv::backend::cuda
