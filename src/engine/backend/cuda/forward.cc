// CudaBackend: the forward pass (metadata, kernel sequence, CUDA graphs).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <cuda_profiler_api.h>

#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/backend_layer.h"
#include "engine/backend/cuda/kernels/activation.h"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/bias.h"
#include "engine/backend/cuda/kernels/elementwise.h"
#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/cuda/kernels/gemv.h"
#include "engine/backend/cuda/kernels/logprob_kernel.h"
#include "engine/backend/cuda/kernels/mma_attention_layout.h"
#include "engine/backend/cuda/kernels/norm.h"
#include "engine/backend/cuda/kernels/qkv_post.h"
#include "engine/backend/cuda/kernels/sample_kernel.h"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.h"
#include "engine/backend/cuda/step_plan.h"
#include "engine/backend/kv_fp8.h"

namespace agentkv::backend::cuda {

namespace {

// Launches of the scope's kernels without programmatic dependent launch
// (where `on`): a kernel launched with it may read its weights before it
// waits for the kernel before it (pdl.cuh), but dequantized weights are
// written by the step itself (CudaBackend::Dequantize), so their GEMM
// starts once every kernel before it has finished.
class PlainLaunches {
 public:
  PlainLaunches(kernels::LaunchConfig& launch, bool on) : launch_(launch), pdl_(launch.pdl) {
    if (on) launch_.pdl = false;
  }
  ~PlainLaunches() { launch_.pdl = pdl_; }
  PlainLaunches(const PlainLaunches&) = delete;
  PlainLaunches& operator=(const PlainLaunches&) = delete;

 private:
  kernels::LaunchConfig& launch_;
  bool pdl_;
};

}  // namespace

cuda::StepModel CudaBackend::PlanModel() const {
  const CudaTuning& tuning = options_.tuning;
  cuda::StepModel m;
  m.num_kv_heads = config_.num_kv_heads;
  m.narrow_tile_tokens = kernels::TokensPerTile(group_size_, false);
  m.wide_tile_tokens = kernels::TokensPerTile(group_size_, true);
  m.wide_supported = kernels::WideAttentionSupported(config_.head_dim);
  m.fused_rotary_supported = kernels::FusedRotarySupported(config_.head_dim);
  m.fp8 = fp8();
  m.graphs = tuning.graphs;
  m.fused_rotary = tuning.fused_rotary;
  m.mma_attention = tuning.mma_attention;
  m.decode_blocks_per_sm = tuning.decode_blocks_per_sm;
  // (The mma.sync kernel's head_dims are the wide tiles'.)
  m.fp8_decode_lean = tuning.fp8_decode_lean && tuning.mma_attention && fp8() &&
                      kernels::WideAttentionSupported(config_.head_dim);
  m.fp8_lean_blocks_per_sm = kernels::MmaMinBlocks(config_.head_dim, 1, true, true);
  m.bf16_decode_blocks_per_sm = bf16_decode_blocks_per_sm_;
  m.num_sms = num_sms_;
  m.kv_map_ok = kv_map_ok_;
  return m;
}

cuda::StepShape CudaBackend::GraphShape(int bucket) const {
  return cuda::GraphShape(bucket, static_cast<int>(spec_.groups.size()), PlanModel(),
                          {cap_parts_, cap_width_});
}

Status CudaBackend::Reserve(int max_step_tokens, int max_batch) {
  if (kv_.empty()) return InvalidArgument("Reserve: AllocateKv first");
  if (max_step_tokens <= 0 || max_batch <= 0)
    return InvalidArgument("Reserve: limits must be positive");
  RETURN_IF_ERROR(EnsureCapacity(max_step_tokens, max_batch, cap_width_));
  RETURN_IF_ERROR(WarmUpGemms());
  if (options_.tuning.graphs) RETURN_IF_ERROR(CaptureGraphs());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaBackend::CaptureGraphs() {
  for (int b = 1; b <= cap_seqs_; b = cuda::DecodeBucket(b) + 1) {
    const int bucket = cuda::DecodeBucket(b);
    for (int slot = 0; slot < kSlots; ++slot) {
      if (bucket > cap_seqs_ || graphs_.count(GraphKey(bucket, slot))) continue;
      const auto c0 = std::chrono::steady_clock::now();
      cudaGraph_t g = nullptr;
      CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      Status st = Enqueue(GraphShape(bucket), slot);
      const cudaError_t end = cudaStreamEndCapture(stream_, &g);
      if (!st.ok()) {
        if (g) cudaGraphDestroy(g);
        return st;
      }
      CUDA_RETURN_IF_ERROR(end);
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      CUDA_RETURN_IF_ERROR(inst);
      graphs_.emplace(GraphKey(bucket, slot), exec);
      capture_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      ++graphs_captured_;
    }
  }
  return Status::Ok();
}

Status CudaBackend::Forward(std::span<const SeqStep> batch, std::span<float> logits) {
  return Run(batch, {}, {}, logits);
}

Status CudaBackend::ForwardSampled(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                                   std::span<int32_t> tokens, std::span<float> logits) {
  return Run(batch, rows, tokens, logits);
}

Status CudaBackend::Run(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                        std::span<int32_t> out_tokens, std::span<float> logits) {
  if (!in_flight_.empty()) return Internal("Forward: pipelined steps are in flight");
  for (const SeqStep& st : batch)
    if (st.prev_row >= 0) return InvalidArgument("Forward: prev_row is for LaunchStep only");
  // Rows picked on the device go to out_tokens, which must hold each of them.
  int W = 0;
  for (const SeqStep& st : batch) W += LogitRows(st);
  const int planned = static_cast<int>(std::min<size_t>(W, rows.size()));
  for (int r = 0; r < planned; ++r)
    if (rows[r].mode != PickMode::kHost && r >= static_cast<int>(out_tokens.size()))
      return InvalidArgument("Forward: tokens buffer too small");
  RETURN_IF_ERROR(LaunchStep(batch, rows, logits));
  std::vector<int32_t> picks(W);
  RETURN_IF_ERROR(CollectStep(picks));
  for (int r = 0; r < planned; ++r)
    if (rows[r].mode != PickMode::kHost) out_tokens[r] = picks[r];
  return Status::Ok();
}

Status CudaBackend::SettleInFlight() {
  if (in_flight_.empty()) return Status::Ok();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(down_stream_));
  for (InFlight& f : in_flight_) {
    if (f.settled) continue;
    const int32_t* tk = host_tokens_[f.slot].get<int32_t>();
    f.host_picks.assign(tk, tk + f.picks);
    TakeLogprobs(f);
    f.settled = true;
  }
  return Status::Ok();
}

void CudaBackend::TakeLogprobs(InFlight& f) {
  if (f.lp_rows.empty()) return;
  const RowLogprobs* lp = host_row_lp_[f.slot].get<RowLogprobs>();
  f.host_lp.assign(lp, lp + f.picks);
  for (int r = 0; r < f.picks; ++r)
    if (f.lp_rows[r] < 0) f.host_lp[r].count = -1;
}

Status CudaBackend::CollectStep(std::span<int32_t> picks) {
  if (in_flight_.empty()) return Internal("CollectStep: no step in flight");
  if (static_cast<int>(picks.size()) < in_flight_.front().picks)
    return InvalidArgument("CollectStep: picks buffer too small");
  InFlight f = std::move(in_flight_.front());
  in_flight_.erase(in_flight_.begin());
  if (!f.settled) {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(step_events_[f.slot][2]));
    const int32_t* tk = host_tokens_[f.slot].get<int32_t>();
    f.host_picks.assign(tk, tk + f.picks);
    TakeLogprobs(f);
  }
  if (f.lp_rows.empty()) {
    RowLogprobs none;
    none.count = -1;
    collected_logprobs_.assign(static_cast<size_t>(f.picks), none);
  } else {
    collected_logprobs_ = std::move(f.host_lp);
  }
  if (f.profile_stop) CUDA_RETURN_IF_ERROR(cudaProfilerStop());
  float ms = 0.f;
  if (cudaEventElapsedTime(&ms, step_events_[f.slot][0], step_events_[f.slot][1]) == cudaSuccess)
    device_seconds_ += ms / 1000.0;
  if (step_log_ && f.T > 0)
    std::fprintf(step_log_, "%d %d %d %d %d %.3f %.3f\n", f.T, f.B, f.padded, f.stride, f.splits,
                 f.capture_ms, ms);
  std::copy(f.host_picks.begin(), f.host_picks.end(), picks.begin());
  if (in_flight_.empty()) last_picks_ = std::move(f.host_picks);  // the last step launched
  return Status::Ok();
}

Status CudaBackend::LaunchStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                               std::span<float> logits) {
  if (static_cast<int>(in_flight_.size()) >= kMaxStepsInFlight)
    return Internal("LaunchStep: " + std::to_string(kMaxStepsInFlight) +
                    " steps already in flight");
  RETURN_IF_ERROR(CheckBatch(batch));
  for (const SeqStep& st : batch)
    if (st.prev_row >= 0 &&
        (st.prev_row >= static_cast<int>(last_greedy_.size()) || !last_greedy_[st.prev_row]))
      return InvalidArgument("LaunchStep: prev_row " + std::to_string(st.prev_row) +
                             " names no device-picked row of the previous step");
  const int64_t V = config_.vocab_size;
  const int bs = layout_.block_size;
  const cuda::StepModel model = PlanModel();
  const cuda::StepSizes z = cuda::SizeStep(batch, rows, spec_, bs, model);
  const int B = z.seqs, T = z.tokens, W = z.rows;
  const bool graph = z.graph;
  const int padded = z.padded, stride = z.stride;
  if (z.any_logits && static_cast<int64_t>(logits.size()) < W * V)
    return InvalidArgument("Forward: logits buffer too small");
  // This step overwrites the device's logits buffer.
  last_kept_rows_ = -1;
  if (T == 0) {  // nothing to run: collected as a step without picks
    InFlight f;
    f.settled = true;
    in_flight_.push_back(std::move(f));
    ++launches_;
    last_greedy_.clear();
    last_picks_.clear();
    return Status::Ok();
  }

  // Blocks this step stores into may still be being read for the tiers.
  for (size_t g = 0; g < spec_.groups.size(); ++g) {
    written_.clear();
    const int ring = spec_.RingBlocks(static_cast<int>(g), bs);
    for (const SeqStep& st : batch)
      cuda::KvReadHazards::WrittenBlocks(st.block_tables[g], st.start_pos,
                                         st.start_pos + static_cast<int64_t>(st.tokens.size()), bs,
                                         ring, &written_);
    RETURN_IF_ERROR(WaitForReads(static_cast<int>(g), written_));
  }

  const int slot = static_cast<int>(launches_ % kSlots);
  std::array<int, kMaxCacheGroups> width{};
  for (size_t g = 0; g < spec_.groups.size(); ++g) width[g] = stride;
  {
    // Growing reallocates the picks' buffers and capturing needs an idle
    // stream: the steps in flight finish first (rare: Reserve sized both).
    bool fits = z.workspace_tokens() <= cap_tokens_ && padded <= cap_seqs_ && W <= cap_rows_;
    for (size_t g = 0; g < spec_.groups.size(); ++g) fits = fits && width[g] <= cap_width_[g];
    if (!fits || (graph && !graphs_.count(GraphKey(padded, slot))))
      RETURN_IF_ERROR(SettleInFlight());
  }
  RETURN_IF_ERROR(EnsureCapacity(z.workspace_tokens(), padded, width, W));
  // The previous step's picks: from the device while it may still run.
  const bool prev_on_device = !in_flight_.empty() && !in_flight_.back().settled;
  const std::vector<int32_t>& prev_host =
      in_flight_.empty() ? last_picks_ : in_flight_.back().host_picks;
  const cuda::StepPlan plan = cuda::BuildStepPlan(z, spec_, bs, model, {cap_parts_, cap_width_});
  int32_t* m = host_meta_[slot].get<int32_t>();
  cuda::WriteStepMeta(batch, plan, static_cast<int>(spec_.groups.size()),
                      {prev_on_device, prev_host}, std::span<int32_t>(m, plan.layout.total),
                      &tile_scratch_);
  const size_t meta_ints = plan.meta_ints;
  if (!step_events_[0][0]) {
    for (auto& sl : step_events_)
      for (cudaEvent_t& e : sl) CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  }
  cudaEvent_t* ev = step_events_[slot];
  InFlight f;
  f.slot = slot;
  f.picks = W;
  f.T = T;
  f.B = B;
  f.padded = graph ? padded : 0;
  f.stride = stride;
  f.splits = plan.shape.splits;
  const bool profiled =
      options_.tuning.profile_batch == B && T == B && ++profile_seen_ >= 20 && profile_seen_ <= 21;
  if (profiled && profile_seen_ == 20) CUDA_RETURN_IF_ERROR(cudaProfilerStart());
  f.profile_stop = profiled && profile_seen_ == 21;
  // The slot's device metadata was last read by the step launched two
  // before this one, which has been collected: the copy may start now,
  // while the step before runs.
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_[slot].get(), m, meta_ints * 4, cudaMemcpyHostToDevice, up_stream_));
  if (z.any_logprobs) {
    f.lp_rows.assign(W, -1);
    for (int r = 0; r < W; ++r)
      if (cuda::RowMode(rows, r) != PickMode::kHost) f.lp_rows[r] = rows[r].logprobs;
  }
  if (z.any_draw || z.any_logprobs) {
    RowPick* hp = host_row_picks_[slot].get<RowPick>();
    for (int r = 0; r < W; ++r) hp[r] = r < static_cast<int>(rows.size()) ? rows[r] : RowPick{};
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(row_picks_[slot].get(), hp, W * sizeof(RowPick),
                                         cudaMemcpyHostToDevice, up_stream_));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[3], up_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, ev[3], 0));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[0], stream_));

  if (tp()) {
    int64_t& count = ReduceInWindow(graph ? padded : plan.shape.tokens) ? window_reduce_steps_
                                                                        : plain_reduce_steps_;
    ++count;
  }
  if (graph) {
    auto it = graphs_.find(GraphKey(padded, slot));
    if (it == graphs_.end()) {
      const double before = capture_seconds_;
      RETURN_IF_ERROR(CaptureGraphs());
      f.capture_ms = 1000 * (capture_seconds_ - before);
      it = graphs_.find(GraphKey(padded, slot));
      if (it == graphs_.end()) return Internal("Forward: no graph for batch " + std::to_string(B));
    }
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
    ++graph_steps_;
  } else {
    RETURN_IF_ERROR(Enqueue(plan.shape, slot));
  }
  // Drawn rows overwrite their argmax in the picks buffer (outside the
  // graphs: they hold the greedy step's kernels only).
  if (z.any_draw)
    CUDA_RETURN_IF_ERROR(kernels::LaunchSampleRows(logits_.get<float>(), W, config_.vocab_size,
                                                   row_picks_[slot].get<RowPick>(),
                                                   argmax_[slot].get<int32_t>(), launch_));
  // Logprobs after the picks they name (the chosen tokens).
  if (z.any_logprobs)
    CUDA_RETURN_IF_ERROR(kernels::LaunchRowLogprobs(
        logits_.get<float>(), W, config_.vocab_size, row_picks_[slot].get<RowPick>(),
        argmax_[slot].get<int32_t>(), row_lp_[slot].get<RowLogprobs>(), row_lp_scratch_.get(),
        launch_));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[1], stream_));

  // All picked on the device: the picks come down on the download stream
  // while the next step runs (it writes the other slot's argmax buffer).
  const bool picks_async = W > 0 && !z.any_logits;
  if (picks_async) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(down_stream_, ev[1], 0));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_tokens_[slot].get(), argmax_[slot].get(), W * 4,
                                         cudaMemcpyDeviceToHost, down_stream_));
    if (z.any_logprobs)
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_row_lp_[slot].get(), row_lp_[slot].get(),
                                           W * sizeof(RowLogprobs), cudaMemcpyDeviceToHost,
                                           down_stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2], down_stream_));
  } else if (W > 0) {
    // Logits (one buffer for every step) come down before the next step.
    if (z.any_greedy)
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_tokens_[slot].get(), argmax_[slot].get(), W * 4,
                                           cudaMemcpyDeviceToHost, stream_));
    if (z.any_logprobs)
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_row_lp_[slot].get(), row_lp_[slot].get(),
                                           W * sizeof(RowLogprobs), cudaMemcpyDeviceToHost,
                                           stream_));
    if (!z.any_greedy) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data(), logits_.get(), W * V * 4,
                                           cudaMemcpyDeviceToHost, stream_));
    } else {
      for (int r = 0; r < W; ++r) {
        if (cuda::RowMode(rows, r) != PickMode::kHost) continue;
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data() + r * V, logits_.get<float>() + r * V,
                                             V * 4, cudaMemcpyDeviceToHost, stream_));
      }
    }
  }
  if (!picks_async) CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2], stream_));
  in_flight_.push_back(std::move(f));
  ++launches_;
  last_greedy_.assign(W, 0);
  for (int r = 0; r < W; ++r) last_greedy_[r] = cuda::RowMode(rows, r) != PickMode::kHost ? 1 : 0;
  if (z.any_keep) last_kept_rows_ = W;
  return Status::Ok();
}

Status CudaBackend::ReadKeptLogits(std::span<const int32_t> rows, std::span<float> logits) {
  if (tp()) return Unimplemented("ReadKeptLogits: not under tensor parallelism");
  if (!in_flight_.empty() || last_kept_rows_ < 0)
    return Internal("ReadKeptLogits: the last step launched kept no logits or is not collected");
  const int64_t V = config_.vocab_size;
  for (int32_t r : rows)
    if (r < 0 || r >= last_kept_rows_)
      return InvalidArgument("ReadKeptLogits: row " + std::to_string(r) + " out of range");
  if (static_cast<int64_t>(logits.size()) < last_kept_rows_ * V)
    return InvalidArgument("ReadKeptLogits: logits buffer too small");
  // On the step's stream: after everything the step wrote.
  for (int32_t r : rows)
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data() + r * V, logits_.get<float>() + r * V, V * 4,
                                         cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaBackend::NormGemm(const float* x, const int32_t* rows, const float* norm_w,
                             const kernels::bf16_t* w, void* y, int m, int n, int64_t max_rows,
                             bool y_f32, bool fused) {
  const model::ModelConfig& c = config_;
  const int H = c.hidden_size;
  if (fused) {
    // (The GEMV reads x as it is: no planes may be pending, nor rows picked.)
    if (rows != nullptr || pending_planes_ != 0)
      return Internal("cuda: the fused norm GEMV needs all rows and no pending planes");
    CUDA_RETURN_IF_ERROR(kernels::LaunchNormGemv(x, norm_w, c.rms_norm_eps, c.gemma_norm, w, y,
                                                 y_f32, m, n, H, 0.f, launch_));
    return Status::Ok();
  }
  RETURN_IF_ERROR(Norm(rows, norm_w, m));
  return Gemm(h_.get<kernels::bf16_t>(), w, y, y_f32, m, n, H, 0.f, max_rows);
}

Status CudaBackend::GateUp(const Layer& L, const kernels::bf16_t* w_gate_up, cuda::GateUpPath path,
                           int T) {
  const model::ModelConfig& c = config_;
  const int H = c.hidden_size, I = c.intermediate_size;
  const int act_kind = cuda::DenseGatedForm(gemm_) == kernels::GatedForm::kGeluTanh ? 1 : 0;
  auto* h = h_.get<kernels::bf16_t>();
  auto* act = act_.get<kernels::bf16_t>();
  switch (path) {
    case cuda::GateUpPath::kNormGemvAct:
      CUDA_RETURN_IF_ERROR(kernels::LaunchNormGemvGatedAct(x_.get<float>(), L.post_attn_norm,
                                                           c.rms_norm_eps, c.gemma_norm, w_gate_up,
                                                           act, T, 2 * I, H, act_kind, launch_));
      return Status::Ok();
    case cuda::GateUpPath::kGemvAct:
      CUDA_RETURN_IF_ERROR(
          kernels::LaunchGemvGatedAct(h, w_gate_up, act, T, 2 * I, H, act_kind, launch_));
      return Status::Ok();
    case cuda::GateUpPath::kWgmmaAct:
      CUDA_RETURN_IF_ERROR(kernels::LaunchWgmmaGemm(h, w_gate_up, act, false, T, 2 * I, H, 0.f,
                                                    {wgmma_ws_.get(), num_sms_}, launch_,
                                                    act_kind));
      return Status::Ok();
    case cuda::GateUpPath::kPromptAct:
      CUDA_RETURN_IF_ERROR(
          kernels::LaunchPromptGemm(h, w_gate_up, act, T, 2 * I, H, act_kind, num_sms_, launch_));
      return Status::Ok();
    case cuda::GateUpPath::kGemmThenAct:
      break;
  }
  auto* gu = gu_.get<kernels::bf16_t>();
  RETURN_IF_ERROR(Gemm(h, w_gate_up, gu, false, T, 2 * I, H, 0.f, cap_tokens_));
  CUDA_RETURN_IF_ERROR(kernels::LaunchGatedAct(gu, act, T, I, act_kind, launch_));
  return Status::Ok();
}

Status CudaBackend::Enqueue(const cuda::StepShape& s, int slot) {
  const model::ModelConfig& c = config_;
  const int T = s.tokens, H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int nh = c.num_heads, nkv = c.num_kv_heads;
  const int qkv_n = (nh + 2 * nkv) * D;
  const float eps = c.rms_norm_eps;
  const bool plus_one = c.gemma_norm;
  const int bs = layout_.block_size;
  const cuda::MetaLayout ml = cuda::LayoutOf(s);
  // How each cache group runs attention in a step of this shape.
  const cuda::StepRoutes routes = cuda::RouteStep(s, spec_, bs, PlanModel());
  int32_t* meta = meta_[slot].get<int32_t>();
  int32_t* picks = argmax_[slot].get<int32_t>();
  const int32_t* prev_picks = argmax_[(slot + kSlots - 1) % kSlots].get<int32_t>();
  const int32_t* pos = meta + ml.pos;
  const int32_t* tok_seq = meta + ml.tok_seq;
  // The summed buffers for this size: every all-reduce of the step is of
  // T rows (a graph's T is its bucket's, so its replays keep the choice).
  SelectReduceBuffers(T);
  float* x = x_.get<float>();
  float* o = o_.get<float>();
  auto* h = h_.get<kernels::bf16_t>();
  auto* q = q_.get<kernels::bf16_t>();
  auto* k = k_.get<kernels::bf16_t>();
  auto* v = v_.get<kernels::bf16_t>();
  auto* attn = attn_.get<kernels::bf16_t>();
  auto* act = act_.get<kernels::bf16_t>();

  pending_planes_ = 0;
  if (tp()) {
    RETURN_IF_ERROR(TpEmbed(meta + ml.tokens, prev_picks, T));
  } else {
    CUDA_RETURN_IF_ERROR(kernels::LaunchEmbed(embed_, meta + ml.tokens, prev_picks, T, H,
                                              c.embed_scale, x, launch_));
  }
  const CudaTuning& tuning = options_.tuning;
  // Which kernel runs each projection of a dense layer (gemm_plan.h);
  // quantized projections take QuantGemm unless the plan dequantizes them
  // for this step (UseDequantGemm), and then run as bf16 ones do.
  const cuda::DenseLayerPlan gemms =
      cuda::PlanDenseLayer(gemm_, T, routes.fused_rotary, kernels::kMaxQkvPlanes);
  // A projection's bf16 weights for this step into *out: w where stored
  // so, q dequantized into the scratch where the plan says, else null
  // (QuantGemm). *plain: the GEMM reading them must launch without
  // programmatic dependent launch (PlainLaunches).
  auto bf16_weights = [&](const kernels::bf16_t* w, const QuantDense& q, int n, int k,
                          const kernels::bf16_t** out, bool* plain) -> Status {
    *out = w;
    *plain = false;
    if (q.codes == nullptr || !cuda::UseDequantGemm(gemm_, T, n, k)) return Status::Ok();
    ASSIGN_OR_RETURN(*out, Dequantize(q));
    *plain = true;
    return Status::Ok();
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    const cuda::AttentionRoute& route = routes.groups[L.group];
    const bool fused_rotary = route.fused_rotary;
    const kernels::bf16_t* wqkv = nullptr;
    bool plain = false;
    RETURN_IF_ERROR(bf16_weights(L.wqkv, L.q_qkv, qkv_n, H, &wqkv, &plain));
    // The decode attention adds the QKV projection's split-K planes itself.
    const int qkv_planes =
        gemms.qkv == cuda::QkvPath::kWgmmaPlanes && wqkv != nullptr ? gemms.qkv_planes : 0;
    {
      const PlainLaunches scope(launch_, plain);
      if (qkv_planes > 0) {
        RETURN_IF_ERROR(Norm(nullptr, L.in_norm, T));
        CUDA_RETURN_IF_ERROR(kernels::LaunchWgmmaGemm(h, wqkv, wgmma_planes_.get(), true, T, qkv_n,
                                                      H, 0.f, {wgmma_ws_.get(), num_sms_}, launch_,
                                                      -1, true));
      } else if (wqkv == nullptr) {  // fp8 (dense_quant.cc), as below
        RETURN_IF_ERROR(Norm(nullptr, L.in_norm, T));
        RETURN_IF_ERROR(QuantGemm(h, L.q_qkv, qkv_.get(), /*y_f32=*/fused_rotary, false, T));
      } else {
        // Steps with prompt chunks: the projection in bf16 for QkvPost
        // (half the bytes of fp32 through memory); decode steps keep fp32
        // for the fused-rotary attention.
        RETURN_IF_ERROR(NormGemm(x, nullptr, L.in_norm, wqkv, qkv_.get(), T, qkv_n, cap_tokens_,
                                 /*y_f32=*/fused_rotary,
                                 /*fused=*/gemms.qkv == cuda::QkvPath::kNormGemv));
      }
    }
    const float* inv_freq =
        L.kind == cache::AttentionKind::kSliding && c.arch == model::Architecture::kGemma3
            ? inv_freq_local_
            : inv_freq_global_;
    kernels::KvCacheView view;
    view.base = kv_[L.group].get<kernels::bf16_t>();
    view.block_stride = static_cast<int64_t>(spec_.BytesPerBlock(L.group, bs) / 2);
    view.layer_offset = static_cast<int64_t>(L.index_in_group) * 2 * bs * nkv * D;
    view.block_size = bs;
    view.ring = spec_.RingBlocks(L.group, bs);
    view.tables = meta + ml.tables[L.group];
    view.table_stride = meta + ml.strides + L.group;
    if (fp8()) {  // byte offsets (kv_fp8.h)
      view.fp8 = true;
      view.base = reinterpret_cast<kernels::bf16_t*>(kv_[L.group].get<unsigned char>());
      view.block_stride = static_cast<int64_t>(spec_.BytesPerBlock(L.group, bs));
      view.layer_offset =
          static_cast<int64_t>(L.index_in_group) * 2 * kvfp8::SectionBytes(bs, nkv, D);
    }
    const bool fused_store = route.store_before;
    // Prompt steps whose attention copies the cache's pages (every key in
    // it once QkvPost has stored the step's): no k / v rows to write.
    kernels::AttentionParams ap;
    ap.mma = tuning.mma_attention;
    ap.wgmma = tuning.wgmma_attention;
    ap.fp8_decode_lean = tuning.fp8_decode_lean;
    ap.wide = s.wide;
    ap.nh = nh;
    ap.nkv = nkv;
    ap.head_dim = D;
    ap.window = L.window;
    ap.cache = view;
    if (route.kv_map) {
      ap.kv_map = kv_maps_.get<unsigned char>() + L.group * kernels::kKvTensorMapBytes;
      ap.kv_map_layer = 2 * L.index_in_group;
    }
    const bool cache_only = !fused_rotary && fused_store && kernels::AttentionReadsCacheOnly(ap);
    // fp8: the step's K and V quantized once, read by attention from there
    // and stored into the cache after it.
    const kernels::Fp8KvRows rows8 =
        fp8() ? kernels::Fp8KvRowsAt(kv8_.get(), cap_tokens_, nkv, D) : kernels::Fp8KvRows{};
    using Qkv = cuda::AttentionRoute::Qkv;
    if (route.qkv == Qkv::kPostQuantize8) {
      CUDA_RETURN_IF_ERROR(kernels::LaunchQkvPost(qkv_.get<kernels::bf16_t>(), L.bqkv, L.q_norm,
                                                  L.k_norm, inv_freq, rope_factor_, pos, T, nh, nkv,
                                                  D, eps, plus_one, q, k, v, launch_));
      CUDA_RETURN_IF_ERROR(kernels::LaunchKvQuantizeFp8(k, v, pos, T, nkv, D, rows8, launch_));
      ap.fp8_new = rows8;
    } else if (route.qkv == Qkv::kPostStore) {
      CUDA_RETURN_IF_ERROR(kernels::LaunchQkvPostStore(
          qkv_.get<kernels::bf16_t>(), L.bqkv, L.q_norm, L.k_norm, inv_freq, rope_factor_, pos,
          tok_seq, T, nh, nkv, D, eps, plus_one, q, cache_only ? nullptr : k,
          cache_only ? nullptr : v, view, launch_));
    } else if (route.qkv == Qkv::kPost) {
      CUDA_RETURN_IF_ERROR(kernels::LaunchQkvPost(qkv_.get<kernels::bf16_t>(), L.bqkv, L.q_norm,
                                                  L.k_norm, inv_freq, rope_factor_, pos, T, nh, nkv,
                                                  D, eps, plus_one, q, k, v, launch_));
    }
    ap.q = q;
    ap.k_new = cache_only ? nullptr : k;
    ap.v_new = cache_only ? nullptr : v;
    ap.pos = pos;
    ap.seq_start = meta + ml.seq_start;
    ap.seq_first = meta + ml.seq_first;
    ap.tile_seq = meta + ml.tile_seq;
    ap.tile_t0 = meta + ml.tile_t0;
    ap.tile_n = meta + ml.tile_n;
    ap.num_tiles = s.tiles;
    ap.tokens = T;
    ap.scale = c.AttentionScale();
    ap.softcap = c.attn_logit_softcap;
    ap.sinks = L.sinks;
    ap.splits = s.splits;
    ap.part_o = part_o_.get<float>();
    ap.part_ml = part_ml_.get<float>();
    ap.out = attn;
    if (fused_rotary) {
      ap.q = ap.k_new = ap.v_new = nullptr;
      ap.qkv = qkv_planes > 0 ? wgmma_planes_.get<float>() : qkv_.get<float>();
      ap.qkv_planes = std::max(1, qkv_planes);
      ap.qkv_plane = static_cast<int64_t>(T) * qkv_n;
      ap.bias = L.bqkv;
      ap.q_norm = L.q_norm;
      ap.k_norm = L.k_norm;
      ap.inv_freq = inv_freq;
      ap.rope_factor = rope_factor_;
      ap.eps = eps;
      ap.plus_one = plus_one;
    }
    CUDA_RETURN_IF_ERROR(kernels::LaunchAttention(ap, launch_));
    using StoreAfter = cuda::AttentionRoute::StoreAfter;
    if (route.store_after == StoreAfter::kFp8) {
      CUDA_RETURN_IF_ERROR(kernels::LaunchKvStoreFp8(
          rows8, pos, tok_seq, meta + ml.seq_start, meta + ml.seq_first, T, nkv, D, view, launch_));
    } else if (route.store_after == StoreAfter::kBf16) {
      CUDA_RETURN_IF_ERROR(kernels::LaunchKvStore(k, v, pos, tok_seq, meta + ml.seq_start,
                                                  meta + ml.seq_first, T, nkv, D, view, launch_));
    }
    const kernels::bf16_t* wo = nullptr;
    RETURN_IF_ERROR(bf16_weights(L.wo, L.q_o, H, nh * D, &wo, &plain));
    if (wo == nullptr) {
      RETURN_IF_ERROR(QuantGemm(attn, L.q_o, c.sandwich_norm ? o : x, true,
                                cuda::QuantResidualAdds(gemm_, options_.tp_comm.rank()), T));
    } else {
      const PlainLaunches scope(launch_, plain);
      RETURN_IF_ERROR(ResidualGemm(attn, wo, T, H, nh * D, gemms.o, gemms.o_planes));
    }
    if (!c.sandwich_norm && L.bo != nullptr)
      CUDA_RETURN_IF_ERROR(kernels::LaunchAddRowBias(x, L.bo, T, H, launch_));
    if (tp()) RETURN_IF_ERROR(TpReduce(c.sandwich_norm ? o : x, T));
    if (c.sandwich_norm)
      CUDA_RETURN_IF_ERROR(kernels::LaunchAddNormed(o, L.post_attn_norm, x, L.pre_ff_norm, h, T, H,
                                                    eps, plus_one, launch_));
    if (L.router != nullptr) {  // a mixture-of-experts layer
      RETURN_IF_ERROR(MoeMlp(L, T));
      continue;
    }
    // kNormGemvAct: the MLP norm, the gate_up GEMV and the activation in one
    // kernel; the others read h. (Sandwich norms: AddNormed above wrote h.)
    const kernels::bf16_t* w_gate_up = nullptr;
    RETURN_IF_ERROR(bf16_weights(L.w_gate_up, L.q_gate_up, 2 * I, H, &w_gate_up, &plain));
    const bool quant_mlp = w_gate_up == nullptr;
    const cuda::GateUpPath gate_up = quant_mlp ? cuda::GateUpPath::kGemmThenAct : gemms.gate_up;
    if (!c.sandwich_norm && gate_up != cuda::GateUpPath::kNormGemvAct)
      RETURN_IF_ERROR(Norm(nullptr, L.post_attn_norm, T));
    if (quant_mlp) {  // fp8: the gated activation in the epilogue (dense_quant.cc)
      RETURN_IF_ERROR(QuantGemm(h, L.q_gate_up, act, false, false, T, /*gated=*/true));
    } else {
      const PlainLaunches scope(launch_, plain);
      RETURN_IF_ERROR(GateUp(L, w_gate_up, gate_up, T));
    }
    float* down_out = c.sandwich_norm ? o : x;
    const kernels::bf16_t* w_down = nullptr;
    RETURN_IF_ERROR(bf16_weights(L.w_down, L.q_down, H, I, &w_down, &plain));
    if (w_down == nullptr) {
      RETURN_IF_ERROR(QuantGemm(act, L.q_down, down_out, true,
                                cuda::QuantResidualAdds(gemm_, options_.tp_comm.rank()), T));
    } else {
      const PlainLaunches scope(launch_, plain);
      RETURN_IF_ERROR(ResidualGemm(act, w_down, T, H, I, gemms.down, gemms.down_planes));
    }
    if (tp()) RETURN_IF_ERROR(TpReduce(down_out, T));
    if (c.sandwich_norm)
      CUDA_RETURN_IF_ERROR(kernels::LaunchAddNormed(o, L.post_ff_norm, x, nullptr, nullptr, T, H,
                                                    eps, plus_one, launch_));
  }
  if (s.rows == 0) {
    pending_planes_ = 0;  // x after the last layer is read by nothing
    return Status::Ok();
  }
  float* logits = logits_.get<float>();
  const cuda::LmHeadPath lm_head = cuda::PlanLmHead(gemm_, s.rows);
  if (lm_head == cuda::LmHeadPath::kPromptArgmax) {
    // The persistent prompt GEMM streams the LM head's weights at ~3 TB/s
    // (178 us at 64 rows against 207 for the warpgroup GEMM; bench/RESULTS.md
    // item 98), with the argmax in its epilogue as below.
    RETURN_IF_ERROR(Norm(meta + ml.logit_rows, final_norm_, s.rows));
    CUDA_RETURN_IF_ERROR(kernels::LaunchPromptGemmArgmax(
        h, lm_head_, logits, meta + ml.store_logits, s.rows, c.vocab_size, H, argmax_scratch_.get(),
        picks, num_sms_, launch_));
    return Status::Ok();
  }
  if (lm_head == cuda::LmHeadPath::kWgmmaArgmax) {
    // The argmax in the GEMM's epilogue; logits stored only for steps that
    // sample a row.
    RETURN_IF_ERROR(Norm(meta + ml.logit_rows, final_norm_, s.rows));
    CUDA_RETURN_IF_ERROR(kernels::LaunchWgmmaGemmArgmax(
        h, lm_head_, logits, meta + ml.store_logits, s.rows, c.vocab_size, H, argmax_scratch_.get(),
        picks, num_sms_, launch_));
    return Status::Ok();
  }
  // (cuBLAS rounds the rows up within what logits_ holds: for rows up to
  // the sequence capacity as for one-row steps, beyond it, drafted steps,
  // within the rows capacity; WarmUpGemms ran both.)
  RETURN_IF_ERROR(NormGemm(x, meta + ml.logit_rows, final_norm_, lm_head_, logits, s.rows,
                           c.vocab_size, s.rows <= cap_seqs_ ? cap_seqs_ : cap_rows_,
                           /*y_f32=*/true, /*fused=*/false));
  if (c.final_logit_softcap > 0.f)
    CUDA_RETURN_IF_ERROR(kernels::LaunchSoftcap(logits, static_cast<int64_t>(s.rows) * c.vocab_size,
                                                c.final_logit_softcap, launch_));
  CUDA_RETURN_IF_ERROR(
      kernels::LaunchArgmax(logits, s.rows, c.vocab_size, picks, argmax_scratch_.get(), launch_));
  if (tp()) RETURN_IF_ERROR(TpCombinePicks(logits, s.rows, picks));
  return Status::Ok();
}

}  // namespace agentkv::backend::cuda
