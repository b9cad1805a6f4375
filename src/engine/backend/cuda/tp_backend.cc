#include "engine/backend/cuda/tp_backend.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "engine/backend/cuda/status.h"
#include "engine/backend/sample_draw.h"
#include "engine/backend/tp_weight_source.h"

namespace agentkv::backend::cuda {

// One thread per rank, its device current; Run hands every thread the same
// job and waits for all of them.
class TpBackend::Workers {
 public:
  explicit Workers(int n) : results_(n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Status Run(const std::function<Status(int)>& fn) {
    std::unique_lock<std::mutex> l(mu_);
    job_ = &fn;
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
    work_cv_.notify_all();
    done_cv_.wait(l, [this] { return pending_ == 0; });
    job_ = nullptr;
    for (const Status& s : results_)
      if (!s.ok()) return s;
    return Status::Ok();
  }

 private:
  void Loop(int r) {
    // The rank's device, current for everything this thread runs.
    const cudaError_t set = cudaSetDevice(r);
    uint64_t seen = 0;
    for (;;) {
      const std::function<Status(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> l(mu_);
        work_cv_.wait(l, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      Status st = set == cudaSuccess ? (*job)(r)
                                     : cuda::CudaStatus(set, "cudaSetDevice", __FILE__, __LINE__);
      std::lock_guard<std::mutex> l(mu_);
      results_[r] = std::move(st);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<Status(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<Status> results_;
  std::vector<std::thread> threads_;
};

struct TpBackend::Step {
  bool device = true;  // every row kGreedy without logprobs: picked on the GPUs
  bool settled = false;
  int rows = 0;
  std::vector<RowPick> picks_asked;  // the engine's, one per row (kHost beyond its span)
  std::span<float> logits;           // the engine's
  std::vector<std::vector<int32_t>> rank_picks;
  std::vector<HostBuffer> rank_logits;  // host mode: rows x the rank's vocabulary
  std::vector<int32_t> picks;           // once settled
};

// A read or write of blocks in flight on the ranks.
struct TpBackend::Transfer {
  bool read = true;
  uint64_t ticket = 0;
  int group = 0;
  size_t count = 0;
  std::span<std::byte> out;            // reads: the caller's buffer
  std::vector<uint64_t> rank_tickets;  // per rank (0: none)
  std::vector<HostBuffer> staging;     // per rank
};

TpBackend::TpBackend(const model::ModelConfig& config, const TpBackendOptions& options, TpPlan plan)
    : config_(config), options_(options), plan_(std::move(plan)) {}

TpBackend::~TpBackend() {
  if (workers_) {
    // Each rank's device memory, streams and graphs go on its own thread.
    (void)RunAll([&](int r) -> Status {
      ranks_[r].reset();
      staging_free_[r].clear();
      return Status::Ok();
    });
  }
  transfers_.clear();
  windows_.reset();
  comms_.reset();
  workers_.reset();
}

Status TpBackend::RunAll(const std::function<Status(int)>& fn) const { return workers_->Run(fn); }

Result<std::unique_ptr<TpBackend>> TpBackend::Create(const model::ModelConfig& config,
                                                     const model::WeightSource& weights,
                                                     const TpBackendOptions& options) {
  if (options.degree < 2)
    return InvalidArgument("tensor parallel: degree " + std::to_string(options.degree) +
                           " (one GPU runs the plain CUDA backend)");
  ASSIGN_OR_RETURN(TpPlan plan, TpPlan::Make(config, options.degree, cuda::VisibleGpus()));
  std::unique_ptr<TpBackend> b(new TpBackend(config, options, std::move(plan)));
  const int n = options.degree;
  b->spec_ = config.CacheSpec(options.rank.kv_dtype);
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = r;
  ASSIGN_OR_RETURN(b->comms_, cuda::NcclComms::Create(devices, options.nccl));
  b->workers_ = std::make_unique<Workers>(n);
  b->ranks_.resize(n);
  b->staging_free_.resize(n);
  for (int r = 0; r < n; ++r)
    b->rank_specs_.push_back(b->plan_.RankConfig(config, r).CacheSpec(options.rank.kv_dtype));
  TpBackend* tp = b.get();
  RETURN_IF_ERROR(b->RunAll([&](int r) -> Status {
    const TpWeightSource w(weights, config, tp->plan_, r);
    CudaBackendOptions o = options.rank;
    o.device = r;
    o.tp_comm = tp->comms_->rank(r);
    o.tp_vocab_begin = tp->plan_.ranks[r].vocab.begin;
    o.tp_vocab_total = config.vocab_size;
    ASSIGN_OR_RETURN(tp->ranks_[r], CudaBackend::Create(tp->plan_.RankConfig(config, r), w, o));
    return Status::Ok();
  }));
  // Only once every rank exists (a rank that failed to load would leave
  // the others waiting in it): one all-reduce outside any graph, so that
  // NCCL connects its ranks before the first capture.
  RETURN_IF_ERROR(b->RunAll([&](int r) -> Status {
    const cuda::NcclRank comm = tp->comms_->rank(r);
    cudaStream_t s = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cuda::DeviceBuffer one;
    Status st = one.Allocate(sizeof(float));
    if (st.ok()) st = comm.SumF32(one.get<float>(), 1, s);
    const cudaError_t sync = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    RETURN_IF_ERROR(st);
    CUDA_RETURN_IF_ERROR(sync);
    return Status::Ok();
  }));
  return b;
}

Result<uint64_t> TpBackend::FreeMemoryBytes() const {
  std::vector<uint64_t> free(ranks_.size());
  RETURN_IF_ERROR(RunAll([&](int r) -> Status {
    ASSIGN_OR_RETURN(free[r], ranks_[r]->FreeMemoryBytes());
    return Status::Ok();
  }));
  double scaled = std::numeric_limits<double>::max();
  for (size_t r = 0; r < free.size(); ++r)
    scaled = std::min(scaled, static_cast<double>(free[r]) *
                                  static_cast<double>(spec_.BytesPerTokenPerLayer()) /
                                  static_cast<double>(rank_specs_[r].BytesPerTokenPerLayer()));
  return static_cast<uint64_t>(scaled);
}

double TpBackend::default_kv_memory_fraction() const {
  return ranks_[0]->default_kv_memory_fraction();
}
int TpBackend::default_step_tokens() const { return ranks_[0]->default_step_tokens(); }
double TpBackend::device_seconds() const { return ranks_[0]->device_seconds(); }
double TpBackend::graph_capture_seconds() const { return ranks_[0]->graph_capture_seconds(); }
int64_t TpBackend::graphs_captured() const { return ranks_[0]->graphs_captured(); }
int64_t TpBackend::graph_steps() const { return ranks_[0]->graph_steps(); }

Status TpBackend::EnsureWindows(int64_t tokens) {
  if (!options_.nccl.symmetric_windows || !windows_refused_.empty()) return Status::Ok();
  window_tokens_ = std::max(window_tokens_, tokens);
  // Room for the steps that sum from the window (TpReduceFromWindow: few
  // tokens), not the whole capacity; the ranks' hidden size is the model's.
  const size_t want = ranks_[0]->ReduceWindowBytes(window_tokens_);
  if (want == 0) return Status::Ok();  // every step's sums are too large for it
  if (windows_ && windows_->bytes() >= want) return Status::Ok();
  auto made = cuda::NcclWindows::Create(*comms_, want);
  if (!made.ok()) {
    // Alike on every rank: the group registered everywhere or nowhere.
    windows_refused_ = made.status().message();
    std::fprintf(stderr, "agentkv: tensor parallel: all-reduces from plain buffers (%s)\n",
                 windows_refused_.c_str());
    if (!windows_) return Status::Ok();
    RETURN_IF_ERROR(RunAll([&](int r) { return ranks_[r]->SetReduceArena(nullptr, 0, false); }));
    windows_.reset();
    return Status::Ok();
  }
  if (!windows_) {
    // Once, with the first window: the NCCL loaded and the ranks' devices
    // decide (alike for every rank: one library, one kind of GPU).
    int major = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    const int version = cuda::NcclLoadedVersion();
    reduce_fence_ = TpWindowReduceNeedsFence(version, major);
    if (reduce_fence_)
      std::fprintf(stderr,
                   "agentkv: tensor parallel: NCCL %d.%d.%d starts its symmetric all-reduces "
                   "without waiting for the kernel before them: a fence kernel precedes each\n",
                   version / 10000, version / 100 % 100, version % 100);
  }
  std::unique_ptr<cuda::NcclWindows> next = std::move(made).value();
  const Status placed = RunAll(
      [&](int r) { return ranks_[r]->SetReduceArena(next->ptr(r), next->bytes(), reduce_fence_); });
  if (!placed.ok()) {
    // No rank may keep a view of `next`, freed on return.
    (void)RunAll([&](int r) { return ranks_[r]->SetReduceArena(nullptr, 0, false); });
    windows_.reset();
    return placed;
  }
  windows_ = std::move(next);  // (the old windows, which no rank uses now, go)
  return Status::Ok();
}

Status TpBackend::AllocateKv(const KvLayout& layout) {
  // The window first, so that the workspaces AllocateKv makes have their
  // views in it.
  RETURN_IF_ERROR(EnsureWindows(std::max(options_.rank.max_step_tokens, options_.rank.max_batch)));
  RETURN_IF_ERROR(RunAll([&](int r) { return ranks_[r]->AllocateKv(layout); }));
  layout_ = layout;
  runs_.assign(ranks_.size(), {});
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (size_t g = 0; g < spec_.groups.size(); ++g)
      runs_[r].push_back(
          TpKvRuns(spec_, plan_, static_cast<int>(r), static_cast<int>(g), layout.block_size));
  return Status::Ok();
}

Status TpBackend::Reserve(int max_step_tokens, int max_batch) {
  RETURN_IF_ERROR(EnsureWindows(std::max(max_step_tokens, max_batch)));
  return RunAll([&](int r) { return ranks_[r]->Reserve(max_step_tokens, max_batch); });
}

Status TpBackend::CopyBlocks(std::span<const cache::KvBlockCopy> copies) {
  return RunAll([&](int r) { return ranks_[r]->CopyBlocks(copies); });
}

Status TpBackend::Forward(std::span<const SeqStep> batch, std::span<float> logits) {
  return ForwardSampled(batch, std::span<const RowPick>(), std::span<int32_t>(), logits);
}

Status TpBackend::ForwardSampled(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                                 std::span<int32_t> tokens, std::span<float> logits) {
  if (!in_flight_.empty()) return Internal("Forward: pipelined steps are in flight");
  for (const SeqStep& st : batch)
    if (st.prev_row >= 0) return InvalidArgument("Forward: prev_row is for LaunchStep only");
  int W = 0;
  for (const SeqStep& st : batch) W += LogitRows(st);
  RETURN_IF_ERROR(LaunchStep(batch, rows, logits));
  std::vector<int32_t> picks(W);
  RETURN_IF_ERROR(CollectStep(picks));
  for (size_t r = 0; r < rows.size() && r < picks.size(); ++r)
    if (rows[r].mode != PickMode::kHost) {
      if (r >= tokens.size()) return InvalidArgument("Forward: tokens buffer too small");
      tokens[r] = picks[r];
    }
  return Status::Ok();
}

Status TpBackend::LaunchStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                             std::span<float> logits) {
  RETURN_IF_ERROR(failed_);
  if (static_cast<int>(in_flight_.size()) >= kMaxStepsInFlight)
    return Internal("LaunchStep: " + std::to_string(kMaxStepsInFlight) +
                    " steps already in flight");
  if (layout_.block_size <= 0) return InvalidArgument("Forward: KV storage not allocated");
  RETURN_IF_ERROR(CheckSteps(batch, config_, spec_, layout_, /*allow_prev_row=*/true));
  auto step = std::make_shared<Step>();
  for (const SeqStep& st : batch) step->rows += LogitRows(st);
  const int W = step->rows;
  step->picks_asked.assign(W, RowPick{});
  for (int r = 0; r < W && r < static_cast<int>(rows.size()); ++r) step->picks_asked[r] = rows[r];
  for (const RowPick& p : step->picks_asked)
    step->device = step->device && p.mode == PickMode::kGreedy && p.logprobs < 0;
  step->logits = logits;
  // kHost rows' logits go to `logits` (row r at r * vocabulary), as on one GPU.
  const bool any_host = std::any_of(step->picks_asked.begin(), step->picks_asked.end(),
                                    [](const RowPick& p) { return p.mode == PickMode::kHost; });
  if (any_host && logits.size() < static_cast<size_t>(W) * config_.vocab_size)
    return InvalidArgument("Forward: logits buffer too small");
  // A pick of the step before that was made on the host (a host-mode step)
  // goes into a copy of the tokens; one made on the GPUs stays there.
  std::vector<SeqStep> steps(batch.begin(), batch.end());
  std::vector<std::vector<int32_t>> owned;
  owned.reserve(steps.size());
  for (SeqStep& st : steps) {
    if (st.prev_row < 0) continue;
    if (last_ == nullptr || st.prev_row >= last_->rows ||
        last_->picks_asked[st.prev_row].mode == PickMode::kHost)
      return InvalidArgument("LaunchStep: prev_row " + std::to_string(st.prev_row) +
                             " names no device-picked row of the previous step");
    if (last_->device) continue;
    RETURN_IF_ERROR(SettleThrough(last_.get()));
    owned.emplace_back(st.tokens.begin(), st.tokens.end());
    owned.back().back() = last_->picks[st.prev_row];
    st.tokens = owned.back();
    st.prev_row = -1;
  }
  const int n = static_cast<int>(ranks_.size());
  step->rank_picks.assign(n, std::vector<int32_t>(W));
  std::vector<RowPick> rank_rows;
  if (step->device) {
    rank_rows = step->picks_asked;
  } else {
    rank_rows.assign(W, RowPick{});  // kHost: every rank's slice comes back
    step->rank_logits.resize(n);
  }
  // (Staging is pinned on the rank's own thread, its device current.)
  const Status st = RunAll([&](int r) -> Status {
    std::span<float> rl;
    if (!step->device) {
      const size_t count = static_cast<size_t>(W) * plan_.ranks[r].vocab.size;
      ASSIGN_OR_RETURN(step->rank_logits[r], TakeStaging(r, count * sizeof(float)));
      rl = std::span<float>(reinterpret_cast<float*>(step->rank_logits[r].span().data()), count);
    }
    return ranks_[r]->LaunchStep(steps, rank_rows, rl);
  });
  if (!st.ok()) {
    // Some ranks may have launched (and wait in a collective) while
    // others refused: the ranks no longer run the same steps.
    failed_ = st;
    return st;
  }
  in_flight_.push_back(step);
  last_ = std::move(step);
  return Status::Ok();
}

Status TpBackend::SettleThrough(const Step* step) {
  for (const std::shared_ptr<Step>& s : in_flight_) {
    if (!s->settled) RETURN_IF_ERROR(Settle(*s));
    if (s.get() == step) break;
  }
  return Status::Ok();
}

Status TpBackend::Settle(Step& s) {
  const Status st = RunAll([&](int r) { return ranks_[r]->CollectStep(s.rank_picks[r]); });
  if (!st.ok()) {
    failed_ = st;
    return st;
  }
  s.settled = true;
  if (s.device) {
    s.picks = std::move(s.rank_picks[0]);  // every rank holds the global picks
    return Status::Ok();
  }
  // The rows' logits side by side, then the picks as the reference makes
  // them (Backend::ForwardSampled).
  const int64_t V = config_.vocab_size;
  full_logits_.resize(static_cast<size_t>(s.rows) * V);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const TpRange& vr = plan_.ranks[r].vocab;
    const float* src = reinterpret_cast<const float*>(s.rank_logits[r].span().data());
    for (int i = 0; i < s.rows; ++i)
      std::memcpy(full_logits_.data() + i * V + vr.begin, src + i * vr.size,
                  static_cast<size_t>(vr.size) * sizeof(float));
    ReturnStaging(static_cast<int>(r), std::move(s.rank_logits[r]));
  }
  s.rank_logits.clear();
  s.picks.assign(s.rows, 0);
  for (int i = 0; i < s.rows; ++i) {
    const std::span<float> row(full_logits_.data() + i * V, static_cast<size_t>(V));
    const RowPick& p = s.picks_asked[i];
    if (p.mode == PickMode::kHost) {
      if (s.logits.size() < static_cast<size_t>(i + 1) * V)
        return InvalidArgument("Forward: logits buffer too small");
      std::copy(row.begin(), row.end(), s.logits.begin() + i * V);
    } else if (p.mode == PickMode::kGreedy) {
      int32_t best = 0;
      float best_v = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < V; ++t)
        if (row[t] > best_v) {  // strict: the lowest id wins ties; NaN never wins
          best_v = row[t];
          best = static_cast<int32_t>(t);
        }
      s.picks[i] = best;
    } else {
      s.picks[i] = PickDeviceRow(row, p);  // (clobbers the gathered row only)
    }
  }
  return Status::Ok();
}

Status TpBackend::CollectStep(std::span<int32_t> picks) {
  RETURN_IF_ERROR(failed_);
  if (in_flight_.empty()) return Internal("CollectStep: no step in flight");
  Step& s = *in_flight_.front();
  if (static_cast<int>(picks.size()) < s.rows)
    return InvalidArgument("CollectStep: picks buffer too small");
  if (!s.settled) RETURN_IF_ERROR(Settle(s));
  std::copy(s.picks.begin(), s.picks.end(), picks.begin());
  RowLogprobs none;
  none.count = -1;
  collected_logprobs_.assign(static_cast<size_t>(s.rows), none);
  in_flight_.erase(in_flight_.begin());
  return Status::Ok();
}

Result<size_t> TpBackend::CheckBlocks(const char* what, int group, std::span<const int32_t> blocks,
                                      size_t buffer_bytes) const {
  if (layout_.block_size <= 0) return InvalidArgument(std::string(what) + ": KV not allocated");
  if (group < 0 || group >= static_cast<int>(spec_.groups.size()))
    return InvalidArgument(std::string(what) + ": group out of range");
  const size_t n = spec_.BytesPerBlock(group, layout_.block_size);
  if (buffer_bytes != n * blocks.size())
    return InvalidArgument(std::string(what) + ": buffer size mismatch");
  return n;
}

Result<HostBuffer> TpBackend::TakeStaging(int r, size_t bytes) {
  std::vector<HostBuffer>& free = staging_free_[r];
  auto best = free.end();
  for (auto it = free.begin(); it != free.end(); ++it)
    if (it->size() >= bytes && (best == free.end() || it->size() < best->size())) best = it;
  if (best != free.end()) {
    HostBuffer b = std::move(*best);
    free.erase(best);
    return b;
  }
  return ranks_[r]->AllocateHostBuffer(bytes);
}

void TpBackend::ReturnStaging(int r, HostBuffer b) {
  if (b.size() > 0) staging_free_[r].push_back(std::move(b));
}

Status TpBackend::ReadBlock(int group, int32_t block, std::span<std::byte> out) {
  return ReadBlocks(group, std::span<const int32_t>(&block, 1), out);
}

Status TpBackend::WriteBlock(int group, int32_t block, std::span<const std::byte> in) {
  return WriteBlocks(group, std::span<const int32_t>(&block, 1), in);
}

Status TpBackend::ReadBlocks(int group, std::span<const int32_t> blocks, std::span<std::byte> out) {
  ASSIGN_OR_RETURN(const uint64_t t, StartReadBlocks(group, blocks, out));
  ASSIGN_OR_RETURN(const bool done, ReadDone(t, /*wait=*/true));
  return done ? Status::Ok() : Internal("ReadBlocks: not done after waiting");
}

Status TpBackend::WriteBlocks(int group, std::span<const int32_t> blocks,
                              std::span<const std::byte> in) {
  ASSIGN_OR_RETURN(const uint64_t t, StartWriteBlocks(group, blocks, in));
  ASSIGN_OR_RETURN(const bool done, WriteDone(t, /*wait=*/true));
  return done ? Status::Ok() : Internal("WriteBlocks: not done after waiting");
}

Result<uint64_t> TpBackend::StartReadBlocks(int group, std::span<const int32_t> blocks,
                                            std::span<std::byte> out) {
  ASSIGN_OR_RETURN(const size_t n, CheckBlocks("StartReadBlocks", group, blocks, out.size()));
  (void)n;
  auto x = std::make_unique<Transfer>();
  x->read = true;
  x->ticket = next_read_ticket_++;
  x->group = group;
  x->count = blocks.size();
  x->out = out;
  const int ranks = static_cast<int>(ranks_.size());
  x->rank_tickets.assign(ranks, 0);
  x->staging.resize(ranks);
  RETURN_IF_ERROR(RunAll([&](int r) -> Status {
    if (!plan_.ranks[r].primary_kv || blocks.empty()) return Status::Ok();
    const size_t bytes = rank_specs_[r].BytesPerBlock(group, layout_.block_size) * blocks.size();
    ASSIGN_OR_RETURN(x->staging[r], TakeStaging(r, bytes));
    ASSIGN_OR_RETURN(x->rank_tickets[r],
                     ranks_[r]->StartReadBlocks(group, blocks, x->staging[r].span().first(bytes)));
    return Status::Ok();
  }));
  const uint64_t ticket = x->ticket;
  transfers_.push_back(std::move(x));
  return ticket;
}

Result<bool> TpBackend::ReadDone(uint64_t ticket, bool wait) {
  auto it = std::find_if(transfers_.begin(), transfers_.end(),
                         [&](const auto& x) { return x->read && x->ticket == ticket; });
  if (it == transfers_.end()) {
    if (ticket == 0 || ticket >= next_read_ticket_)
      return InvalidArgument("ReadDone: unknown ticket");
    return true;  // merged and released before
  }
  Transfer& x = **it;
  std::vector<uint8_t> done(ranks_.size(), 1);
  RETURN_IF_ERROR(RunAll([&](int r) -> Status {
    if (x.rank_tickets[r] == 0) return Status::Ok();
    ASSIGN_OR_RETURN(const bool d, ranks_[r]->ReadDone(x.rank_tickets[r], wait));
    done[r] = d ? 1 : 0;
    return Status::Ok();
  }));
  if (std::find(done.begin(), done.end(), 0) != done.end()) return false;
  // Every rank's heads into the single-GPU layout (the ranks' threads:
  // disjoint bytes of `out`).
  const size_t n = spec_.BytesPerBlock(x.group, layout_.block_size);
  RETURN_IF_ERROR(RunAll([&](int r) -> Status {
    if (x.rank_tickets[r] == 0) return Status::Ok();
    const size_t rn = rank_specs_[r].BytesPerBlock(x.group, layout_.block_size);
    const std::span<const std::byte> staged = x.staging[r].span();
    for (size_t i = 0; i < x.count; ++i)
      TpMergeKvBlock(runs_[r][x.group], staged.subspan(i * rn, rn), x.out.subspan(i * n, n));
    return Status::Ok();
  }));
  for (size_t r = 0; r < ranks_.size(); ++r)
    ReturnStaging(static_cast<int>(r), std::move(x.staging[r]));
  transfers_.erase(it);
  return true;
}

Result<uint64_t> TpBackend::StartWriteBlocks(int group, std::span<const int32_t> blocks,
                                             std::span<const std::byte> in) {
  ASSIGN_OR_RETURN(const size_t n, CheckBlocks("StartWriteBlocks", group, blocks, in.size()));
  auto x = std::make_unique<Transfer>();
  x->read = false;
  x->ticket = next_write_ticket_++;
  x->group = group;
  x->count = blocks.size();
  const int ranks = static_cast<int>(ranks_.size());
  x->rank_tickets.assign(ranks, 0);
  x->staging.resize(ranks);
  RETURN_IF_ERROR(RunAll([&](int r) -> Status {
    if (blocks.empty()) return Status::Ok();
    // Every holder of the heads gets them (replicas too).
    const size_t rn = rank_specs_[r].BytesPerBlock(group, layout_.block_size);
    ASSIGN_OR_RETURN(x->staging[r], TakeStaging(r, rn * blocks.size()));
    const std::span<std::byte> staged = x->staging[r].span().first(rn * blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i)
      TpSplitKvBlock(runs_[r][group], in.subspan(i * n, n), staged.subspan(i * rn, rn));
    ASSIGN_OR_RETURN(x->rank_tickets[r], ranks_[r]->StartWriteBlocks(group, blocks, staged));
    return Status::Ok();
  }));
  const uint64_t ticket = x->ticket;
  transfers_.push_back(std::move(x));
  return ticket;
}

Result<bool> TpBackend::WriteDone(uint64_t ticket, bool wait) {
  auto it = std::find_if(transfers_.begin(), transfers_.end(),
                         [&](const auto& x) { return !x->read && x->ticket == ticket; });
  if (it == transfers_.end()) {
    if (ticket == 0 || ticket >= next_write_ticket_)
      return InvalidArgument("WriteDone: unknown ticket");
    return true;
  }
  Transfer& x = **it;
  std::vector<uint8_t> done(ranks_.size(), 1);
  RETURN_IF_ERROR(RunAll([&](int r) -> Status {
    if (x.rank_tickets[r] == 0) return Status::Ok();
    ASSIGN_OR_RETURN(const bool d, ranks_[r]->WriteDone(x.rank_tickets[r], wait));
    done[r] = d ? 1 : 0;
    return Status::Ok();
  }));
  if (std::find(done.begin(), done.end(), 0) != done.end()) return false;
  for (size_t r = 0; r < ranks_.size(); ++r)
    ReturnStaging(static_cast<int>(r), std::move(x.staging[r]));
  transfers_.erase(it);
  return true;
}

Result<HostBuffer> TpBackend::AllocateHostBuffer(size_t bytes) {
  return ranks_[0]->AllocateHostBuffer(bytes);
}

}  // namespace agentkv::backend::cuda
