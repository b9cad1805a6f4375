// CudaBackend: the forward pass on one NVIDIA GPU, built for Hopper (sm_90;
// the warpgroup kernels run on compute capability 9.0 only, and the steps
// take other kernels elsewhere).
//
// Weights live on the GPU in bf16 (mixture-of-experts experts stored as
// fp8 with block scales or mxfp4 stay so, dequantized inside the expert
// kernels; fp8 dense projections too, with a scale per row and block of
// columns, on the same kernels' one-group form; norm weights, biases and
// rotary frequencies in fp32; the MLP's gate and up
// rows interleaved, so that a block holds both halves of its outputs and the gated activation can
// sit in a GEMM's epilogue); the residual stream is fp32, GEMM inputs bf16, accumulation fp32.
//
// GEMMs: which kernel runs each product, by the step's rows, is the GEMM
// plan's choice (gemm_plan.h says it in full: GEMVs for 1 and 2 rows with
// the norm or the activation fused where they fit, the warpgroup GEMM to 64
// rows with split-K planes for the residual projections, the persistent
// prompt GEMM beyond, the argmax in the LM head's epilogue, cuBLAS for the
// rest); Enqueue and Gemm launch it. From 512 rows the QKV and gate_up
// projections on cuBLAS take the cuBLASLt algorithm GemmTuner timed
// fastest, at row counts rounded up to ones WarmUpGemms ran.
//
// The KV cache is bf16, or e4m3 with per-row scales
// (CudaBackendOptions::kv_dtype, docs/kv-fp8.md), paged, one allocation per
// cache group in exactly the ReadBlock/WriteBlock layout of backend.h, so
// those are plain copies; sliding-window groups are rings, as in the CPU
// backend. Attention is flash-style over the pages (kernels/attention.h;
// kernels/kv_route.h's rules, applied per step and cache group by
// cuda::RouteStep, step_plan.h):
// - steps with prompt chunks: wide tiles of 64 query rows where the
//   head_dim has them (64, 128): at head_dim 64 with bf16 on compute
//   capability 9.0 on the warpgroup kernel (kernels/wgmma_attention.cu; whole pages copied by TMA
//   where every key is in the cache: full-attention groups, K and V stored by QkvPost first), else
//   on the mma.sync kernel (kernels/flash_attention.cu, both caches); other head_dims narrow tiles
//   as below.
// - decode steps: narrow tiles of 16 query rows, keys split across blocks,
//   on the mma.sync kernel where it has the head_dim, which for bf16 also
//   applies the rotary and stores the token's K and V (the QKV projection
//   stays fp32 for it; prompt steps round it to bf16 for QkvPost); other
//   head_dims (or CudaTuning::mma_attention off) on the portable WMMA kernel
//   (kernels/attention.cu; for fp8 kernels/fp8_kv.cu).
// Every attention path applies the per-head sinks (GPT-OSS) where it
// normalises a row (the split merge where keys are split), and every rotary
// (QkvPost, the fused decode rotary) multiplies cos and sin by YaRN's
// attention factor (1 for other ropes).
//
// Mixture-of-experts layers (GPT-OSS, Qwen3-MoE; moe_layer.cc,
// kernels/moe.h) keep router and experts in bf16 (gate and up rows
// interleaved per expert) and run, for any row count: the router in fp32
// from the residual (as the CPU reference routes: bf16 rounding would flip
// near ties), routing (top-k) and grouping of the (token, slot)
// assignments by expert on the device, a grouped GEMM over the gathered
// rows with the (clamped) SwiGLU in its epilogue, the down GEMM, and the
// weighted sum into the residual. Every size but the groups' comes from
// the host, so these steps are graph-captured as the dense ones. The
// grouped GEMM is a plain WMMA kernel for now (tiles of 64 rows, no
// pipelining); a decode step's tile per expert streams that expert's
// weights once (a GEMV per selected expert).
//
// K and V reach the cache before attention (QkvPostStore, or the fused
// decode kernel) except where a ring slot they overwrite may still be read
// in the step (prompt chunks in sliding groups: KvStore after attention).
// fp8 steps quantize their K and V rows once, attention reads the step's
// keys from those, and they go into the cache after it.
//
// Steps where every sequence decodes one token and wants logits run as a
// CUDA graph captured once per batch-size bucket and slot (the kernels read
// the block-table width from the step metadata). Kernels launch with
// programmatic dependent launch on sm_90+ (cuda::LaunchConfig), so that each
// one's blocks are resident before the one before ends. LaunchStep plans a
// step (step_plan.h: sizes, metadata, routes), has Enqueue launch what the
// plan says, and returns; CollectStep waits for its
// picks: greedy rows are picked on the GPU (the LM head's epilogue, or the
// argmax kernel) and kDevice rows drawn there (LaunchSampleRows), so only
// kHost rows' logits cross PCIe and the next step's embedding reads the
// picks on the device. Reads of KV blocks for the host tier and the store
// (StartReadBlocks) run on a stream of their own beside the steps; a step
// writing into a block still being read waits for that read
// (cuda::KvReadHazards). Workspaces are sized at AllocateKv for
// `max_step_tokens` tokens and `max_batch` sequences, at Reserve for the
// engine's limits, and only grow (outside the steady state) when a step
// needs more; the decode loop allocates nothing.
//
// CudaBackendOptions::tuning (CudaTuning) turns each of these choices off
// for comparisons and diagnostics; docs/cuda.md lists the switches.
//
// Thread-safety: as Backend; one thread at a time. Owns its CUDA streams and
// cuBLAS handle; runs on options.device (0 by default), made current at
// creation.
#pragma once

#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/block_runs.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/gemm_plan.h"
#include "engine/backend/cuda/gemm_tuner.h"
#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kv_read_hazards.h"
#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/reduce_buffer.h"
#include "engine/backend/cuda/step_plan.h"
#include "engine/backend/cuda_tuning.h"
#include "engine/model/weight_source.h"

namespace agentkv::backend::cuda {

struct CudaBackendOptions {
  int device = 0;
  int max_step_tokens = 2048;  // initial workspace capacity (grows on demand)
  int max_batch = 256;         // initial sequence capacity (grows on demand)
  // Kernel choices and diagnostics (graphs among them); the defaults are
  // the measured best.
  CudaTuning tuning;
  // kBF16, or kFP8E4M3 (docs/kv-fp8.md: its own attention kernel over
  // narrow tiles, no fused rotary, no wide or TMA paths; kv_route.h).
  cache::KvDtype kv_dtype = cache::KvDtype::kBF16;
  // Tensor parallelism (docs/tensor-parallel.md; TpBackend makes these):
  // this backend is one rank, built for TpPlan::RankConfig with its cut of
  // the weights (TpWeightSource). Inactive (the default): the single-GPU
  // path, unchanged. Active: the embedding covers the vocabulary slice from
  // tp_vocab_begin and is summed over the ranks; the o and down projections'
  // outputs (partial sums: rank 0 adds the residual, the others start from
  // zero) are all-reduced before the next norm, with no split-K planes; the
  // LM head's local argmax becomes the global one through one max
  // all-reduce of argmax keys (no fused-argmax LM head: its logits must be
  // stored). Every collective is on the compute stream, so the decode
  // graphs hold them. Only kGreedy and kHost rows (no kDevice draws, no
  // device logprobs: they would see the slice only).
  cuda::NcclRank tp_comm;
  int64_t tp_vocab_begin = 0;
  int tp_vocab_total = 0;  // the full vocabulary (token ids are global)
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> Create(const model::ModelConfig& config,
                                                     const model::WeightSource& weights,
                                                     const CudaBackendOptions& options);
  ~CudaBackend() override;

  const model::ModelConfig& config() const override { return config_; }
  const cache::ModelCacheSpec& cache_spec() const override { return spec_; }
  std::string name() const override { return "cuda"; }
  std::string kv_format() const override { return cache::KvDtypeName(spec_.kv_dtype); }
  uint32_t kv_element_size() const override {
    return static_cast<uint32_t>(cache::KvDtypeBytes(spec_.kv_dtype));
  }

  // cudaMemGetInfo's free bytes of this backend's device.
  Result<uint64_t> FreeMemoryBytes() const override;
  // 90% of what is free once weights, workspaces and graphs exist: the rest
  // is the margin for block tables that grow with the longest context,
  // cuBLAS's workspaces and other processes' contexts.
  double default_kv_memory_fraction() const override { return 0.90; }
  Status AllocateKv(const KvLayout& layout) override;
  // 8,192: prompt chunks of 2,048 ran below the rate of larger ones; c64
  // 21.1k -> 21.5k tok/s, c128 26.0k -> 27.3k, at ~7 ms more time to first
  // token and longer steps for sequences decoding beside a long prompt
  // (bench/RESULTS.md).
  int default_step_tokens() const override { return 8192; }
  // Grows the workspaces, warms the GEMMs up to max_step_tokens rows and
  // captures the decode graphs. (Block tables still grow with the longest
  // context seen: reserving the model's whole context would make every
  // graph step of a multi-group model copy the widest tables.)
  Status Reserve(int max_step_tokens, int max_batch) override;
  // Tensor-parallel ranks (TpBackend): the rank's symmetric NCCL window
  // (`bytes` at `base`, NcclWindows; null or 0: none). The residual stream
  // (and a sandwich-norm model's o output) are allocations of their own for
  // whole steps and, where PlaceTpReduce(config, ReduceWindowRows(the token
  // capacity), bytes) says they fit, also views in the window; a step runs
  // from the views (NCCL's symmetric kernels) when TpReduceFromWindow says
  // so for its all-reduces' size (tokens x hidden x 4 bytes), from its own
  // allocations otherwise, graph steps included (a graph's size is its
  // bucket's). Every rank must get a window of the same size, so that the
  // placement and each step's choice (and NCCL's choice of kernel) are the
  // same on every rank. `fence`: every all-reduce from the window is
  // preceded by kernels::LaunchStreamFence (TpWindowReduceNeedsFence for
  // the NCCL loaded). Drops the captured graphs and places the buffers
  // anew (their contents are lost: call between steps). The window must
  // outlive this backend or the next call.
  Status SetReduceArena(void* base, size_t bytes, bool fence);
  // The rows the window views hold for a capacity of `tokens` tokens:
  // every step TpReduceFromWindow sends there (TpWindowTokens), with room
  // for the row count a GEMM of those rows writes (cuda::GemmRows, as the
  // own allocations have), at most `tokens`; 0 where no step would sum
  // from a window. ReduceWindowBytes: the window that holds them (0: none
  // needed).
  int64_t ReduceWindowRows(int64_t tokens) const;
  size_t ReduceWindowBytes(int64_t tokens) const;
  // Whether steps of few tokens sum from the window now (the views exist),
  // whether those sums are fenced (SetReduceArena), and how many steps have
  // run (launched: graph replays included) from the window and from the
  // own allocations under tensor parallelism.
  bool residual_in_window() const { return x_.has_window(); }
  bool reduce_fenced() const { return x_.has_window() && reduce_fence_; }
  int64_t window_reduce_steps() const { return window_reduce_steps_; }
  int64_t plain_reduce_steps() const { return plain_reduce_steps_; }
  const KvLayout& kv_layout() const override { return layout_; }
  Status CopyBlocks(std::span<const cache::KvBlockCopy> copies) override;
  // Several logits rows per sequence (speculative verification): the LM
  // head, its argmax, the device draws and the logprobs run over every row
  // (a sequence's rows in token order), as for one row per sequence. Such
  // steps run kernel by kernel (no graph: StepSizes::graph says why).
  bool multi_logit_rows() const override { return true; }
  Status Forward(std::span<const SeqStep> batch, std::span<float> logits) override;
  using Backend::ForwardSampled;
  using Backend::LaunchStep;
  Status ForwardSampled(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                        std::span<int32_t> tokens, std::span<float> logits) override;
  // Queued on the stream; the picks of the step before come from the
  // device's argmax buffer (the embedding reads them), so consecutive steps
  // run back to back. The buffers a step's copies use (metadata and picks,
  // host and device) alternate between two slots, and the copies run on
  // streams of their own: the metadata goes up while the step before runs,
  // and an all-greedy step's picks come down while the next one runs, so
  // neither copy sits between two steps on the compute stream. Steps that
  // grow the workspaces or capture a graph first wait for those in flight.
  // Forward / ForwardSampled refuse to run while steps are in flight.
  Status LaunchStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                    std::span<float> logits) override;
  Status CollectStep(std::span<int32_t> picks) override;
  // Rows asking for logprobs are picked on the device too: LaunchRowLogprobs
  // runs after the picks and only RowLogprobs come down (not the logits).
  bool picks_logprobs() const override { return true; }
  // keep_logits rows' logits stay in the device's logits buffer until the
  // next step; ReadKeptLogits copies rows of it down (synchronously). Not
  // under tensor parallelism (each rank holds a slice of the vocabulary).
  bool reads_kept_logits() const override { return !tp(); }
  bool picks_on_device() const override { return true; }
  Status ReadKeptLogits(std::span<const int32_t> rows, std::span<float> logits) override;
  int steps_in_flight() const override { return static_cast<int>(in_flight_.size()); }
  Status ReadBlock(int group, int32_t block, std::span<std::byte> out) override;
  Status WriteBlock(int group, int32_t block, std::span<const std::byte> in) override;
  // Every copy goes async into a pinned staging buffer (grown on demand, kept),
  // one synchronisation per 64 MiB: a per-block synchronous copy to pageable
  // memory stalled the engine thread for whole agent turns of KV.
  Status ReadBlocks(int group, std::span<const int32_t> blocks, std::span<std::byte> out) override;
  // Checks every block id, then one async copy per block and one
  // synchronisation: from pinned memory (AllocateHostBuffer) the copies run
  // back to back at the link's rate.
  Status WriteBlocks(int group, std::span<const int32_t> blocks,
                     std::span<const std::byte> in) override;
  // One async copy per block on the KV read stream, after everything on
  // the compute stream so far, then an event: the ticket names it. Later
  // writes into those blocks wait for it (cuda::KvReadHazards). Events come
  // from a ring of kReadEvents; a ticket whose event was recorded again
  // since is answered by the newer (later) one.
  Result<uint64_t> StartReadBlocks(int group, std::span<const int32_t> blocks,
                                   std::span<std::byte> out) override;
  Result<bool> ReadDone(uint64_t ticket, bool wait) override;
  // Copies on the compute stream (after the pending reads of those blocks,
  // cuda::KvReadHazards), batched as StartReadBlocks's, then an event from
  // a ring of kWriteEvents: steps, block copies and reads issued later run
  // after the copies by stream order, so the engine thread never waits for
  // them; the event only tells when `in` may be reused. A ticket whose
  // event was recorded again since is answered by the newer one.
  Result<uint64_t> StartWriteBlocks(int group, std::span<const int32_t> blocks,
                                    std::span<const std::byte> in) override;
  Result<bool> WriteDone(uint64_t ticket, bool wait) override;
  // Pinned (cudaHostAlloc) memory.
  Result<HostBuffer> AllocateHostBuffer(size_t bytes) override;

  double device_seconds() const override { return device_seconds_; }
  // Steps run through a captured graph so far (for tests and benchmarks).
  int64_t graph_steps() const override { return graph_steps_; }
  // Bytes of GPU memory the weights hold (quantized experts at their
  // stored size; moe_layer.cc).
  uint64_t weight_bytes() const;
  // Bytes of the bf16 scratch fp8 dense projections are dequantized into
  // for many-token steps (CudaTuning::dense_dequant; 0: none): the largest
  // projection's, allocated at creation, beside the weights and outside
  // weight_bytes().
  uint64_t dequant_scratch_bytes() const { return dequant_.bytes(); }
  double graph_capture_seconds() const override { return capture_seconds_; }
  int64_t graphs_captured() const override { return graphs_captured_; }

 private:
  struct Layer;
  CudaBackend(const model::ModelConfig& config, const CudaBackendOptions& options);
  Status Init(const model::WeightSource& weights);
  // Quantized dense weights (backend_layer.h; dense_quant.cc).
  struct QuantDense;
  // names' bf16 rows stacked (interleaved for gate and up), into one
  // allocation at *out. Where `quant` is given and the checkpoint stores
  // the names quantized: loaded so into *quant instead (LoadQuantDense),
  // *out null.
  Status UploadBf16(const model::WeightSource& w, const std::vector<std::string>& names,
                    const std::vector<std::vector<int64_t>>& shapes, kernels::bf16_t** out,
                    bool interleave_rows = false, QuantDense* quant = nullptr);
  // fp8 dense weights (block, channel or tensor scales) as stored, parts
  // stacked or interleaved as UploadBf16 does, with a scale per row and
  // block of columns (dense_quant.cc).
  Status LoadQuantDense(const model::WeightSource& w, const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& shapes, bool interleave_rows,
                        QuantDense* out);
  // y = x[m] . w^T for quantized w on the MoE kernels' one-group form (the
  // GEMV for decode-sized m, the tensor cores' tiles otherwise): y fp32
  // (added into it with accumulate) or bf16; `gated`: the model's gated
  // activation (cuda::DenseGatedForm: SwiGLU, or GELU-tanh for Gemma 3) of
  // the interleaved gate and up rows into bf16 y [m][n / 2].
  Status QuantGemm(const kernels::bf16_t* x, const QuantDense& w, void* y, bool y_f32,
                   bool accumulate, int m, bool gated = false);
  // w dequantized to bf16 into dequant_ (kernels::LaunchDequantFp8), for
  // the bf16 GEMMs of steps cuda::UseDequantGemm sends so; the scratch
  // holds one projection at a time: its readers are queued before the next
  // Dequantize (stream order; the kernel waits for the one before it).
  Result<const kernels::bf16_t*> Dequantize(const QuantDense& w);
  Status UploadF32(const model::WeightSource& w, const std::vector<std::string>& names,
                   const std::vector<std::vector<int64_t>>& shapes, float** out);
  // `bytes` of host memory into a new weight allocation (moe_layer.cc).
  Status UploadHost(const void* data, size_t bytes, void** out);
  // Layer `layer`'s router and experts in the device layout
  // (backend_layer.h), bf16 (moe_layer.cc).
  Status LoadMoeLayer(const model::WeightSource& w, int layer, Layer* L);
  // The MLP of a mixture-of-experts layer for T tokens: the norm, the
  // router, routing and grouping, the experts, and their weighted sum added
  // into x_ (kernels/moe.h; moe_layer.cc).
  Status MoeMlp(const Layer& L, int T);
  Status CheckBatch(std::span<const SeqStep> batch) const;
  // Tensor parallelism (forward_tp.cc; CudaBackendOptions::tp_comm).
  bool tp() const { return options_.tp_comm.active(); }
  // The rank's embedding of the step's tokens, summed over the ranks.
  Status TpEmbed(const int32_t* tokens, const int32_t* prev_picks, int T);
  // buf (T rows of the hidden size, fp32) summed over the ranks.
  Status TpReduce(float* buf, int T);
  // The local picks of `rows` rows made global (keys, max all-reduce).
  Status TpCombinePicks(const float* logits, int rows, int32_t* picks);
  // The checks every batched block copy makes (group, every block id,
  // buffer of exactly blocks.size() blocks); returns the bytes per block.
  Result<size_t> CheckBlockBatch(const char* what, int group, std::span<const int32_t> blocks,
                                 size_t buffer_bytes) const;
  // x_ and o_ for cap_tokens_ tokens (allocated anew with `allocate`),
  // their views in the window for ReduceWindowRows(cap_tokens_) rows where
  // PlaceTpReduce says they fit (none otherwise); all zeroed, the own
  // allocations in use.
  Status PlaceReduceBuffers(bool allocate);
  // Whether a step of T tokens (padded, for graphs) sums from the window
  // views: TpReduceFromWindow for its all-reduces, rows for it in the views.
  bool ReduceInWindow(int T) const;
  // x_ and o_ as a step of T tokens uses them (ReduceInWindow); called
  // before anything of the step reads their addresses.
  void SelectReduceBuffers(int T);
  // Grows the workspaces to hold `tokens` tokens, `seqs` sequences, block
  // tables `width` wide and `rows` logits rows (0: as many as sequences).
  Status EnsureCapacity(int64_t tokens, int64_t seqs, const std::array<int, kMaxCacheGroups>& width,
                        int64_t rows = 0);
  Status Run(std::span<const SeqStep> batch, std::span<const RowPick> rows,
             std::span<int32_t> tokens, std::span<float> logits);
  // The picks of the steps in flight, waited for and kept on the host (before
  // anything that reallocates the buffers they are in).
  Status SettleInFlight();
  // A launched step until it is collected.
  struct InFlight {
    int slot = 0;
    int picks = 0;  // want_logits rows
    bool settled = false;
    std::vector<int32_t> host_picks;  // once settled
    // Per want_logits row, RowPick::logprobs of device-picked rows (-1:
    // none); empty when no row asked. Their RowLogprobs once settled.
    std::vector<int8_t> lp_rows;
    std::vector<RowLogprobs> host_lp;
    // For the step log and the profiler.
    int T = 0, B = 0, padded = 0, stride = 0, splits = 0;
    double capture_ms = 0;
    bool profile_stop = false;
  };
  std::vector<InFlight> in_flight_;  // oldest first, at most kMaxStepsInFlight
  // Moves a settled step's RowLogprobs from its slot's pinned buffer to
  // f.host_lp (count -1 for rows that asked none).
  void TakeLogprobs(InFlight& f);
  uint64_t launches_ = 0;
  // The last step launched: its want_logits rows picked on the device
  // (kGreedy or kDevice: what prev_row may name) and, once collected, its
  // picks.
  std::vector<uint8_t> last_greedy_;
  // Logits rows of the last step launched when some row of it kept its
  // logits (RowPick::keep_logits); -1 otherwise.
  int64_t last_kept_rows_ = -1;
  std::vector<int32_t> last_picks_;
  // The executor: the forward pass of shape `s` on the stream, each cache
  // group's attention as cuda::RouteStep says, reading the metadata of
  // `slot` (cuda::WriteStepMeta's), writing the picks to that slot's argmax
  // buffer and reading the previous step's from the other slot's.
  Status Enqueue(const cuda::StepShape& s, int slot);
  // What the step plan needs to know of the model, the device, the tuning
  // and the KV allocation (step_plan.h).
  cuda::StepModel PlanModel() const;
  // y[m][n] = x[m][k] . w[n][k]^T (+ beta * y). cuBLAS runs it on m rounded
  // up by GemmRows (at most max_rows, what x and y hold): rows are
  // independent, the extra ones are scratch, and every row count cuBLAS
  // sees is one WarmUpGemms ran. Its first call at an unseen row count took
  // 5-15 ms (kernel selection and loading): prefill chunks of arbitrary
  // length met it again and again.
  Status Gemm(const kernels::bf16_t* x, const kernels::bf16_t* w, void* y, bool y_f32, int m, int n,
              int k, float beta, int64_t max_rows);
  // The facts the GEMM choices follow (gemm_plan.h), once wgmma_min_rows_
  // and the tuning are final.
  cuda::GemmModel MakeGemmModel() const;
  // The residual-adding projections (o, down; x += a . w^T) as the plan
  // says: the warpgroup kernel's split-K planes (`planes` of them), which
  // the next norm adds (pending_planes_); Gemm with beta 1; a tensor-
  // parallel partial sum; or, with sandwich norms, into o_.
  Status ResidualGemm(const kernels::bf16_t* a, const kernels::bf16_t* w, int m, int n, int k,
                      cuda::ResidualPath path, int planes);
  // gate_up of layer L and its gated activation into act_, as the plan
  // says (h_ holds the normed rows unless the path normalises x_ itself).
  // (w_gate_up: L's bf16 weights, or their dequantized copy.)
  Status GateUp(const Layer& L, const kernels::bf16_t* w_gate_up, cuda::GateUpPath path, int T);
  // h = RMSNorm(x[rows]) (rows null: all m), adding the pending planes first.
  Status Norm(const int32_t* rows, const float* norm_w, int m);
  // y = RMSNorm(x[rows]) . w^T (y fp32, or bf16): in one GEMV where the
  // plan fuses the norm (rows null, no planes pending), else through h_.
  Status NormGemm(const float* x, const int32_t* rows, const float* norm_w,
                  const kernels::bf16_t* w, void* y, int m, int n, int64_t max_rows, bool y_f32,
                  bool fused);
  // The shape of a graph step of `bucket` sequences (width-independent;
  // cuda::GraphShape at the current capacity).
  cuda::StepShape GraphShape(int bucket) const;
  // Captures the graph of every bucket up to the sequence capacity that has
  // none yet: the first graph step after start or a workspace growth pays
  // for all of them at once instead of stalling later steps.
  Status CaptureGraphs();
  // Runs every GEMM shape of the model once at each row count Gemm can hand
  // cuBLAS (GemmRows) up to the token capacity, those not run yet.
  Status WarmUpGemms();
  int64_t gemms_warm_tokens_ = 0;  // row counts up to this are warm
  void ClearGraphs();

  model::ModelConfig config_;
  cache::ModelCacheSpec spec_;
  CudaBackendOptions options_;
  KvLayout layout_;
  int num_sms_ = 0;
  // kernels::MmaBf16DecodeBlocksPerSm(head_dim) on this device, asked once
  // at Init (StepModel::bf16_decode_blocks_per_sm).
  int bf16_decode_blocks_per_sm_ = 0;
  int group_size_ = 1;
  cudaStream_t stream_ = nullptr;
  // The kernels' launches: on stream_, with programmatic dependent launch
  // unless CudaTuning::pdl is off.
  kernels::LaunchConfig launch_;
  // Per-step copies off the compute stream, one stream each way: a pick's
  // download waits for its step to end, and the next step's metadata must
  // not queue behind that wait.
  cudaStream_t up_stream_ = nullptr, down_stream_ = nullptr;
  // Per slot: the start and end of each forward pass on the stream
  // (device_seconds), the end of its copies back (CollectStep waits on it)
  // and its metadata's arrival on the device (the forward pass waits on it).
  // A slot is reused two launches later, after its step was collected, so
  // its buffers are idle by then.
  static constexpr int kSlots = Backend::kMaxStepsInFlight;
  static_assert(kSlots >= 2, "the embedding reads the previous slot's picks");
  cudaEvent_t step_events_[kSlots][4] = {};
  double device_seconds_ = 0;
  static constexpr int kReadEvents = 64;
  std::vector<cudaEvent_t> read_events_;
  // Reads of KV blocks for the host tier and the store run here, beside the
  // steps: on the compute stream, 64 finished agents' blocks (1.3 GB of the
  // 1B shape, twice: host tier and store) delayed the next steps by tens of
  // milliseconds.
  cudaStream_t read_stream_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // where a read starts on the compute stream
  std::unique_ptr<cuda::KvReadHazards> read_hazards_;
  std::vector<int32_t> written_;  // scratch: blocks a write touches
  // Copies `blocks` of `group` (n bytes each) to or from `host`, where
  // block k of the request is at host + k * n: one copy per run of
  // consecutive ids, issued as one batch on `stream`.
  Status CopyBlockRuns(int group, std::span<const int32_t> blocks, std::byte* host, size_t n,
                       bool to_host, cudaStream_t stream);
  std::vector<cuda::BlockRun> runs_;
  std::vector<void*> batch_dst_;
  std::vector<const void*> batch_src_;
  std::vector<size_t> batch_bytes_;
  // Makes the compute stream wait for the pending reads of `blocks`.
  Status WaitForReads(int group, std::span<const int32_t> blocks);
  uint64_t next_read_ticket_ = 1;
  uint64_t reads_done_ = 0;  // every ticket up to this one is complete
  // Asynchronous writes (StartWriteBlocks), tickets as for the reads.
  static constexpr int kWriteEvents = 64;
  std::vector<cudaEvent_t> write_events_;
  uint64_t next_write_ticket_ = 1;
  uint64_t writes_done_ = 0;
  // Whether `ticket` of a ring of `events` (tickets below `next`; every one
  // up to *done is known complete) is done; waits for it with `wait`.
  static Result<bool> TicketDone(const std::vector<cudaEvent_t>& events, uint64_t ticket,
                                 uint64_t next, uint64_t* done, bool wait, const char* what);
  cublasHandle_t cublas_ = nullptr;
  // Prompt-sized cuBLAS GEMMs with the algorithm timed fastest at
  // WarmUpGemms (CudaTuning::gemm_tune off: cuBLAS's default choice).
  cuda::GemmTuner tuner_;

  std::vector<cuda::DeviceBuffer> weight_mem_;  // every weight allocation
  kernels::bf16_t* embed_ = nullptr;
  kernels::bf16_t* lm_head_ = nullptr;  // == embed_ when tied
  float* final_norm_ = nullptr;
  float* inv_freq_global_ = nullptr;
  float* inv_freq_local_ = nullptr;
  // YaRN's attention factor on cos and sin (kernels::RopeAttentionFactor of
  // config.rope, as the CPU backend applies it to every layer); 1 otherwise.
  float rope_factor_ = 1.f;
  std::vector<Layer> layers_;
  // Per-step scratch for ordering attention tiles (capacity kept).
  std::vector<std::array<int, 4>> tile_scratch_;

  std::vector<cuda::DeviceBuffer> kv_;  // per group
  // Per group, the TMA descriptor of its blocks (cuda::EncodeKvTensorMap,
  // kKvTensorMapBytes apart) where one could be made; kv_map_ok_ says which.
  cuda::DeviceBuffer kv_maps_;
  std::array<bool, kMaxCacheGroups> kv_map_ok_{};

  // Workspaces, sized for cap_tokens_ / cap_seqs_; those of logits rows
  // (logits_, argmax_, argmax_scratch_, the row picks and logprobs, and
  // their host copies) for cap_rows_ (>= cap_seqs_).
  int64_t cap_tokens_ = 0, cap_seqs_ = 0, cap_parts_ = 0, cap_rows_ = 0;
  // The logits rows reserved at least (up to the token capacity): room
  // for the drafts of small batches (the engine drafts while a step holds
  // fewer rows than its compute-bound size, 32 by default), so that the
  // first drafted step of a server of few sequences need not grow the
  // workspaces and capture its graphs again. 64 rows of a 152k vocabulary
  // are 39 MB.
  static constexpr int64_t kMinLogitRows = 64;
  std::array<int, kMaxCacheGroups> cap_width_{};
  cuda::DeviceBuffer h_, qkv_, q_, k_, v_, attn_, gu_, act_, logits_, argmax_scratch_, part_o_,
      part_ml_, cublas_ws_, wgmma_ws_;
  // The residual stream [T][H] fp32 and the o projection's output [T][H]
  // fp32: what tensor parallelism all-reduces, summed from the rank's
  // window in steps of few tokens (SetReduceArena; PlaceReduceBuffers,
  // SelectReduceBuffers).
  cuda::ReduceBuffer x_, o_;
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  bool reduce_fence_ = false;  // SetReduceArena's `fence`
  int64_t window_reduce_steps_ = 0, plain_reduce_steps_ = 0;
  // fp8 dense projections dequantized for many-token steps (Dequantize):
  // bf16, the largest projection's n * k (cuda::DequantScratchElems);
  // empty where no projection is quantized or CudaTuning::dense_dequant is
  // off.
  cuda::DeviceBuffer dequant_;
  // Mixture-of-experts workspaces (empty for dense models), for cap_tokens_
  // tokens of k experts each (A = cap_tokens_ * k assignments): router
  // logits [T][E] fp32, experts and weights [A], the grouping (offsets and
  // tiles [E + 1] each, order and slot_of [A]), the activations [A][I] bf16
  // and the experts' outputs [A][H] fp32.
  cuda::DeviceBuffer moe_logits_, moe_experts_, moe_weights_, moe_plan_, moe_act_, moe_y_;
  // Tensor parallelism: the config steps are checked against (the full
  // vocabulary: token ids are global), and one argmax key per logits row
  // (cap_seqs_).
  model::ModelConfig tp_check_config_;
  cuda::DeviceBuffer tp_keys_;
  // fp8 cache: the step's quantized K/V rows (cuda::Fp8KvRowsAt, cap_tokens_).
  cuda::DeviceBuffer kv8_;
  bool fp8() const { return spec_.kv_dtype == cache::KvDtype::kFP8E4M3; }
  // Rows from which Gemm uses the warpgroup GEMM (up to kMaxWgmmaRows;
  // cuda::WgmmaMinRows: kNeverRows off compute capability 9.0), and its
  // split-K scratch (wgmma_ws_).
  int wgmma_min_rows_ = cuda::kNeverRows;
  cuda::GemmModel gemm_;
  // Split-K planes of the last ResidualGemm not yet added to x_ (their
  // count; 0: none), each plane_floats_ apart in wgmma_planes_ (which the
  // QKV projection's planes reuse: each user runs after the last reader).
  cuda::DeviceBuffer wgmma_planes_;
  int pending_planes_ = 0;
  int64_t plane_floats_ = 0;
  // Per slot: the step's metadata and its picks (the LM head's argmax).
  cuda::DeviceBuffer meta_[kSlots], argmax_[kSlots];
  cuda::PinnedBuffer host_meta_[kSlots], host_tokens_[kSlots];
  // Per slot: the step's RowPicks (one per want_logits row) for
  // LaunchSampleRows, uploaded with the metadata when a row is kDevice.
  cuda::DeviceBuffer row_picks_[kSlots];
  cuda::PinnedBuffer host_row_picks_[kSlots];
  // Per slot: the step's RowLogprobs (LaunchRowLogprobs), one per
  // want_logits row, and their copy on the host.
  cuda::DeviceBuffer row_lp_[kSlots];
  // LaunchRowLogprobs' per-slice partials (one buffer: the kernels of
  // successive steps run in order on stream_).
  cuda::DeviceBuffer row_lp_scratch_;
  cuda::PinnedBuffer host_row_lp_[kSlots];
  cuda::PinnedBuffer read_staging_;  // ReadBlocks

  std::map<int, cudaGraphExec_t> graphs_;  // by GraphKey(bucket, slot)
  static int GraphKey(int bucket, int slot) { return bucket * kSlots + slot; }
  int64_t graph_steps_ = 0;
  int64_t graphs_captured_ = 0;
  double capture_seconds_ = 0;  // host time capturing and instantiating graphs
  // CudaTuning::step_log opened for appending (null: none).
  std::FILE* step_log_ = nullptr;
  // Pure decode steps of CudaTuning::profile_batch sequences seen so far.
  int profile_seen_ = 0;
};

}  // namespace agentkv::backend::cuda
