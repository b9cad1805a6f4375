// CudaBackend: creation, weights, KV storage and workspaces. The forward
// pass itself is in forward.cc.
#include "engine/backend/cuda/backend.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "engine/backend/cuda/backend_layer.h"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/cuda/kernels/gemv.h"
#include "engine/backend/cuda/kernels/logprob_kernel.h"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/kernels/norm.h"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"
#include "engine/backend/cuda/kernels/wgmma_prompt_gemm.h"
#include "engine/backend/rope.h"
#include "engine/backend/tp_reduce_plan.h"

namespace agentkv::backend::cuda {
namespace {

uint16_t F32ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

CudaBackend::CudaBackend(const model::ModelConfig& config, const CudaBackendOptions& options)
    : config_(config), options_(options) {}

CudaBackend::~CudaBackend() {
  ClearGraphs();
  if (stream_) cudaStreamSynchronize(stream_);
  if (read_stream_) {
    cudaStreamSynchronize(read_stream_);
    cudaStreamDestroy(read_stream_);
  }
  if (compute_mark_) cudaEventDestroy(compute_mark_);
  for (cudaEvent_t e : read_events_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : write_events_)
    if (e) cudaEventDestroy(e);
  for (auto& slot : step_events_)
    for (cudaEvent_t e : slot)
      if (e) cudaEventDestroy(e);
  if (cublas_) cublasDestroy(cublas_);
  if (step_log_) std::fclose(step_log_);
  for (cudaStream_t cs : {up_stream_, down_stream_}) {
    if (!cs) continue;
    cudaStreamSynchronize(cs);
    cudaStreamDestroy(cs);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const model::ModelConfig& config,
                                                         const model::WeightSource& weights,
                                                         const CudaBackendOptions& options) {
  RETURN_IF_ERROR(cuda::DeviceAvailable());
  if (config.num_layers <= 0 || config.hidden_size <= 0 || config.num_heads <= 0 ||
      config.num_kv_heads <= 0 || config.head_dim <= 0 || config.vocab_size <= 0 ||
      config.num_heads % config.num_kv_heads != 0)
    return InvalidArgument("cuda backend: unsupported model shape");
  if (config.head_dim % 16 != 0 || config.head_dim > kernels::kMaxAttentionHeadDim)
    return Unimplemented("cuda backend: head_dim must be a multiple of 16 up to " +
                         std::to_string(kernels::kMaxAttentionHeadDim) + ", not " +
                         std::to_string(config.head_dim));
  if (config.num_heads / config.num_kv_heads > 16)
    return Unimplemented("cuda backend: more than 16 query heads per KV head");
  if (config.IsMoe() &&
      (config.moe.num_experts > kernels::kMaxMoeExperts ||
       config.moe.experts_per_token > kernels::kMaxMoeTopK || config.moe.experts_per_token <= 0 ||
       config.moe.experts_per_token > config.moe.num_experts))
    return InvalidArgument("cuda backend: " + std::to_string(config.moe.num_experts) +
                           " experts, " + std::to_string(config.moe.experts_per_token) +
                           " per token: more than the MoE kernels take");
  if (config.IsMoe() && config.hidden_size > kernels::kMaxMoeRouterHidden)
    return InvalidArgument("cuda backend: hidden size " + std::to_string(config.hidden_size) +
                           " is past the MoE router kernel's " +
                           std::to_string(kernels::kMaxMoeRouterHidden));
  if (config.IsMoe() && config.moe.swiglu_limit <= 0.f &&
      config.activation != model::Activation::kSilu)
    return InvalidArgument("cuda backend: experts take SwiGLU or GPT-OSS's clamped SwiGLU only");
  if (options.kv_dtype != cache::KvDtype::kBF16 && options.kv_dtype != cache::KvDtype::kFP8E4M3)
    return InvalidArgument(std::string("cuda backend: KV dtype ") +
                           cache::KvDtypeName(options.kv_dtype) +
                           " is not supported (bf16 or fp8_e4m3)");
  if (options.tp_comm.active() &&
      (options.tp_vocab_total < config.vocab_size || options.tp_vocab_begin < 0 ||
       options.tp_vocab_begin + config.vocab_size > options.tp_vocab_total))
    return InvalidArgument("cuda backend: tensor-parallel vocabulary slice out of range");
  std::unique_ptr<CudaBackend> b(new CudaBackend(config, options));
  // A tensor-parallel rank's LM head stores its logits slice for the
  // argmax keys: no fused-argmax epilogue.
  if (options.tp_comm.active()) {
    b->options_.tuning.lm_argmax = false;
    b->tp_check_config_ = config;
    b->tp_check_config_.vocab_size = options.tp_vocab_total;
  }
  const CudaTuning& t = b->options_.tuning;
  if (!t.step_log.empty()) b->step_log_ = std::fopen(t.step_log.c_str(), "a");
  RETURN_IF_ERROR(b->Init(weights));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, b->options_.device));
  b->wgmma_min_rows_ =
      cuda::WgmmaMinRows(t, config.hidden_size, /*sm90=*/prop.major == 9 && prop.minor == 0);
  b->gemm_ = b->MakeGemmModel();
  if (b->wgmma_min_rows_ <= kernels::kMaxWgmmaRows) {
    RETURN_IF_ERROR(b->wgmma_ws_.Allocate(kernels::WgmmaGemmWorkspaceBytes(b->num_sms_)));
    CUDA_RETURN_IF_ERROR(cudaMemset(b->wgmma_ws_.get(), 0, b->wgmma_ws_.bytes()));
    const int64_t qkv_n = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim;
    RETURN_IF_ERROR(b->wgmma_planes_.Allocate(static_cast<size_t>(kernels::kMaxWgmmaSplits) *
                                              kernels::kMaxWgmmaRows *
                                              std::max<int64_t>(config.hidden_size, qkv_n) * 4));
  }
  return b;
}

Status CudaBackend::Init(const model::WeightSource& w) {
  const model::ModelConfig& c = config_;
  spec_ = c.CacheSpec(options_.kv_dtype);
  if (static_cast<int>(spec_.groups.size()) > kMaxCacheGroups)
    return InvalidArgument("cuda backend: too many cache groups");
  group_size_ = c.num_heads / c.num_kv_heads;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device));
  // (0 where the query fails: bf16 decode splits then stop at 32.)
  bf16_decode_blocks_per_sm_ = kernels::MmaBf16DecodeBlocksPerSm(c.head_dim);
  (void)cudaGetLastError();  // a failed query's error is not the first launch's
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Every kernel of the steps launches so (CudaTuning::pdl off: plainly).
  launch_ = kernels::LaunchConfig(stream_, options_.tuning.pdl);
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&up_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&down_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&read_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  // A fixed workspace: cuBLAS then allocates nothing per call (graph capture).
  RETURN_IF_ERROR(cublas_ws_.Allocate(32u << 20));
  CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(cublas_, cublas_ws_.get(), cublas_ws_.bytes()));
  RETURN_IF_ERROR(
      tuner_.Init(stream_, cublas_ws_.get(), cublas_ws_.bytes(), options_.tuning.gemm_tune_log));

  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t nq = c.num_heads * D, nkv = c.num_kv_heads * D;
  RETURN_IF_ERROR(UploadBf16(w, {"model.embed_tokens.weight"}, {{c.vocab_size, H}}, &embed_));
  lm_head_ = embed_;
  if (!c.tie_word_embeddings)
    RETURN_IF_ERROR(UploadBf16(w, {"lm_head.weight"}, {{c.vocab_size, H}}, &lm_head_));
  RETURN_IF_ERROR(UploadF32(w, {"model.norm.weight"}, {{H}}, &final_norm_));
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    RETURN_IF_ERROR(UploadF32(w, {p + "input_layernorm.weight"}, {{H}}, &L.in_norm));
    RETURN_IF_ERROR(
        UploadF32(w, {p + "post_attention_layernorm.weight"}, {{H}}, &L.post_attn_norm));
    if (c.sandwich_norm) {
      RETURN_IF_ERROR(
          UploadF32(w, {p + "pre_feedforward_layernorm.weight"}, {{H}}, &L.pre_ff_norm));
      RETURN_IF_ERROR(
          UploadF32(w, {p + "post_feedforward_layernorm.weight"}, {{H}}, &L.post_ff_norm));
    }
    RETURN_IF_ERROR(UploadBf16(w,
                               {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                                p + "self_attn.v_proj.weight"},
                               {{nq, H}, {nkv, H}, {nkv, H}}, &L.wqkv, false, &L.q_qkv));
    if (c.attention_bias)
      RETURN_IF_ERROR(UploadF32(
          w,
          {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"},
          {{nq}, {nkv}, {nkv}}, &L.bqkv));
    if (c.qk_norm) {
      RETURN_IF_ERROR(UploadF32(w, {p + "self_attn.q_norm.weight"}, {{D}}, &L.q_norm));
      RETURN_IF_ERROR(UploadF32(w, {p + "self_attn.k_norm.weight"}, {{D}}, &L.k_norm));
    }
    if (c.attention_sinks)
      RETURN_IF_ERROR(UploadF32(w, {p + "self_attn.sinks"}, {{c.num_heads}}, &L.sinks));
    RETURN_IF_ERROR(
        UploadBf16(w, {p + "self_attn.o_proj.weight"}, {{H, nq}}, &L.wo, false, &L.q_o));
    if (c.o_proj_bias) RETURN_IF_ERROR(UploadF32(w, {p + "self_attn.o_proj.bias"}, {{H}}, &L.bo));
    if (c.IsMoeLayer(l)) {
      RETURN_IF_ERROR(LoadMoeLayer(w, l, &L));
    } else {
      // Gate and up rows interleaved (cuda::LaunchGatedAct's layout).
      RETURN_IF_ERROR(UploadBf16(w, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                                 {{I, H}, {I, H}}, &L.w_gate_up, /*interleave_rows=*/true,
                                 &L.q_gate_up));
      RETURN_IF_ERROR(
          UploadBf16(w, {p + "mlp.down_proj.weight"}, {{H, I}}, &L.w_down, false, &L.q_down));
    }
    L.kind = c.layer_kinds.at(l);
    L.window = c.layer_windows.at(l);
    L.group = spec_.GroupOf(l);
    L.index_in_group = spec_.IndexInGroup(l);
  }
  // The dequantization scratch: allocated here, before the KV pool is sized
  // from what memory is left (engine/kv_pool_sizing.cc), so it is counted.
  if (options_.tuning.dense_dequant) {
    std::vector<std::array<int64_t, 2>> shapes;
    for (const Layer& L : layers_)
      for (const QuantDense* q : {&L.q_qkv, &L.q_o, &L.q_gate_up, &L.q_down})
        if (q->codes != nullptr) shapes.push_back({q->n, q->k});
    const int64_t elems = cuda::DequantScratchElems(shapes);
    if (elems > 0) {
      RETURN_IF_ERROR(dequant_.Allocate(static_cast<size_t>(elems) * 2));
      // (Zeros for the GEMM warm-ups that run on it before any step.)
      CUDA_RETURN_IF_ERROR(cudaMemset(dequant_.get(), 0, dequant_.bytes()));
    }
  }
  rope_factor_ = RopeAttentionFactor(c.rope);
  for (auto [rope, out] :
       {std::pair{&c.rope, &inv_freq_global_}, std::pair{&c.rope_local, &inv_freq_local_}}) {
    const std::vector<float> f = RopeInvFreq(*rope, c.head_dim);
    cuda::DeviceBuffer buf;
    RETURN_IF_ERROR(buf.Allocate(f.size() * sizeof(float)));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(buf.get(), f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
    *out = buf.get<float>();
    weight_mem_.push_back(std::move(buf));
  }
  return Status::Ok();
}

Status CudaBackend::UploadBf16(const model::WeightSource& w, const std::vector<std::string>& names,
                               const std::vector<std::vector<int64_t>>& shapes,
                               kernels::bf16_t** out, bool interleave_rows, QuantDense* quant) {
  if (quant != nullptr && w.IsQuantized(names[0])) {
    *out = nullptr;
    return LoadQuantDense(w, names, shapes, interleave_rows, quant);
  }
  int64_t total = 0;
  for (const auto& s : shapes) total += Elements(s);
  if (interleave_rows && (names.size() != 2 || shapes[0] != shapes[1] || shapes[0].size() != 2))
    return InvalidArgument("UploadBf16: rows interleave two matrices of one shape");
  cuda::DeviceBuffer buf;
  RETURN_IF_ERROR(buf.Allocate(static_cast<size_t>(total) * 2));
  std::vector<std::vector<uint16_t>> all;
  int64_t off = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (w.IsQuantized(names[i]))  // (the embeddings, the LM head; or a part of a projection)
      return Unimplemented("cuda backend: " + names[i] +
                           " is stored quantized; the CUDA backend reads quantized experts and "
                           "quantized dense projections (all of their parts) only");
    std::vector<uint16_t> bits;
    if (auto e = w.LoadBf16IfStored(names[i], shapes[i]); e.ok()) {
      bits = std::move(e).value();
    } else {
      ASSIGN_OR_RETURN(std::vector<float> f, w.LoadF32(names[i], shapes[i]));
      bits.resize(f.size());
      for (size_t j = 0; j < f.size(); ++j) bits[j] = F32ToBf16Bits(f[j]);
    }
    if (interleave_rows) {
      all.push_back(std::move(bits));
      continue;
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.get<uint16_t>() + off, bits.data(), bits.size() * 2,
                                    cudaMemcpyHostToDevice));
    off += static_cast<int64_t>(bits.size());
  }
  if (interleave_rows) {
    const int64_t rows = shapes[0][0], cols = shapes[0][1];
    std::vector<uint16_t> mixed(static_cast<size_t>(total));
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < 2; ++h)
        std::copy_n(all[h].begin() + r * cols, cols, mixed.begin() + (2 * r + h) * cols);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(buf.get<uint16_t>(), mixed.data(), mixed.size() * 2, cudaMemcpyHostToDevice));
  }
  *out = buf.get<kernels::bf16_t>();
  weight_mem_.push_back(std::move(buf));
  return Status::Ok();
}

Status CudaBackend::UploadF32(const model::WeightSource& w, const std::vector<std::string>& names,
                              const std::vector<std::vector<int64_t>>& shapes, float** out) {
  int64_t total = 0;
  for (const auto& s : shapes) total += Elements(s);
  cuda::DeviceBuffer buf;
  RETURN_IF_ERROR(buf.Allocate(static_cast<size_t>(total) * 4));
  int64_t off = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    ASSIGN_OR_RETURN(std::vector<float> f, w.LoadF32(names[i], shapes[i]));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(buf.get<float>() + off, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    off += static_cast<int64_t>(f.size());
  }
  *out = buf.get<float>();
  weight_mem_.push_back(std::move(buf));
  return Status::Ok();
}

Result<uint64_t> CudaBackend::FreeMemoryBytes() const {
  size_t free = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  return static_cast<uint64_t>(free);
}

Status CudaBackend::AllocateKv(const KvLayout& layout) {
  if (layout.block_size <= 0) return InvalidArgument("block_size must be positive");
  // fp8 sections (block_size * kv_heads * (head_dim + 4) bytes) must keep
  // the 16-byte alignment the kernels' vector accesses need.
  if (fp8() && layout.block_size * config_.num_kv_heads % 4 != 0)
    return InvalidArgument("fp8 KV cache: block_size x kv heads must be a multiple of 4");
  ClearGraphs();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(read_stream_));
  layout_ = layout;
  read_hazards_ = std::make_unique<cuda::KvReadHazards>(
      std::span<const int32_t>(layout.blocks_per_group.data(), spec_.groups.size()));
  kv_.clear();
  kv_.resize(spec_.groups.size());
  std::array<int, kMaxCacheGroups> width{};
  for (size_t g = 0; g < spec_.groups.size(); ++g) {
    const size_t bytes = spec_.BytesPerBlock(static_cast<int>(g), layout.block_size) *
                         static_cast<size_t>(layout.blocks_per_group[g]);
    RETURN_IF_ERROR(kv_[g].Allocate(bytes));
    if (bytes) CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_[g].get(), 0, bytes, stream_));
    width[g] = 16;
  }
  // The prompt-step attention's page copies (full-attention groups only:
  // a sliding ring's slots may be overwritten within the step).
  kv_map_ok_.fill(false);
  const size_t nmaps = spec_.groups.size();
  RETURN_IF_ERROR(kv_maps_.Allocate(nmaps * kernels::kKvTensorMapBytes));
  for (size_t g = 0; g < nmaps; ++g) {
    alignas(64) unsigned char map[kernels::kKvTensorMapBytes];
    const int gi = static_cast<int>(g);
    if (fp8() || !options_.tuning.wgmma_attention || spec_.RingBlocks(gi, layout.block_size) != 0 ||
        layout.blocks_per_group[g] <= 0 ||
        !kernels::EncodeKvTensorMap(
            kv_[g].get<kernels::bf16_t>(), layout.blocks_per_group[g],
            static_cast<int64_t>(spec_.BytesPerBlock(gi, layout.block_size) / 2),
            static_cast<int>(spec_.groups[g].layers.size()), layout.block_size,
            config_.num_kv_heads, config_.head_dim, map))
      continue;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(kv_maps_.get<unsigned char>() + g * sizeof(map), map,
                                         sizeof(map), cudaMemcpyHostToDevice, stream_));
    kv_map_ok_[g] = true;
  }
  RETURN_IF_ERROR(EnsureCapacity(options_.max_step_tokens, options_.max_batch, width));
  RETURN_IF_ERROR(WarmUpGemms());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaBackend::WarmUpGemms() {
  const model::ModelConfig& c = config_;
  const int H = c.hidden_size, I = c.intermediate_size, A = c.num_heads * c.head_dim;
  const int qkv_n = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const Layer& L = layers_[0];
  // The dense MLP's GEMMs at a dense layer's weights (MoE layers run no
  // cuBLAS GEMM; a model of MoE layers only has none to warm).
  const Layer* dense = nullptr;
  for (const Layer& d : layers_)
    if (d.w_gate_up != nullptr || d.q_gate_up.codes != nullptr) {
      dense = &d;
      break;
    }
  // The weights a GEMM of m rows runs on: the bf16 ones, or for quantized
  // projections the dequantization scratch where the plan sends m rows
  // there (whatever it holds; null: the quantized kernels, nothing to warm).
  auto* scratch = dequant_.get<kernels::bf16_t>();
  auto bf16 = [&](const kernels::bf16_t* w, const QuantDense& q, int m, int n,
                  int k) -> const kernels::bf16_t* {
    if (w != nullptr || q.codes == nullptr) return w;
    return cuda::UseDequantGemm(gemm_, m, n, k) ? scratch : nullptr;
  };
  if (cap_tokens_ <= gemms_warm_tokens_) return Status::Ok();
  // Every row count Gemm hands cuBLAS up to the capacity (GemmRows).
  std::vector<int> rows;
  for (int m = 1; m < cap_tokens_; m = cuda::GemmRows(m) + 1) rows.push_back(cuda::GemmRows(m));
  rows.push_back(static_cast<int>(cap_tokens_));
  // The LM head runs on up to B rows in graph and one-row steps (cuBLAS
  // rounds within B, as before), on up to R in drafted steps.
  const int64_t T = cap_tokens_, B = cap_seqs_, R = cap_rows_;
  for (int m : rows) {
    if (m <= gemms_warm_tokens_ || m > T) continue;
    // Inputs are whatever the workspaces hold; every output is overwritten
    // before it is read by a real step.
    // QKV: fp32 for decode steps (the fused-rotary attention), bf16 for
    // steps with prompt chunks (QkvPost).
    if (const kernels::bf16_t* wqkv = bf16(L.wqkv, L.q_qkv, m, qkv_n, H); wqkv != nullptr) {
      RETURN_IF_ERROR(Gemm(h_.get<kernels::bf16_t>(), wqkv, qkv_.get(), true, m, qkv_n, H, 0.f, T));
      RETURN_IF_ERROR(
          Gemm(h_.get<kernels::bf16_t>(), wqkv, qkv_.get(), false, m, qkv_n, H, 0.f, T));
    }
    // As Enqueue calls them: sandwich-norm models write o, the others add
    // into the residual stream x (another cuBLAS kernel family), in the
    // own allocations (m rows up to the capacity).
    SelectReduceBuffers(0);
    void* res = c.sandwich_norm ? o_.get() : x_.get();
    const float beta = c.sandwich_norm ? 0.f : 1.f;
    if (const kernels::bf16_t* wo = bf16(L.wo, L.q_o, m, H, A); wo != nullptr)
      RETURN_IF_ERROR(Gemm(attn_.get<kernels::bf16_t>(), wo, res, true, m, H, A, beta, T));
    const kernels::bf16_t* w_gate_up =
        dense != nullptr ? bf16(dense->w_gate_up, dense->q_gate_up, m, 2 * I, H) : nullptr;
    const kernels::bf16_t* w_down =
        dense != nullptr ? bf16(dense->w_down, dense->q_down, m, H, I) : nullptr;
    if (w_gate_up == nullptr) {
    } else if (cuda::UsePromptGemm(gemm_, m, 2 * I, H)) {
      CUDA_RETURN_IF_ERROR(kernels::LaunchPromptGemm(
          h_.get<kernels::bf16_t>(), w_gate_up, act_.get<kernels::bf16_t>(), m, 2 * I, H,
          cuda::DenseGatedForm(gemm_) == kernels::GatedForm::kGeluTanh ? 1 : 0, num_sms_, launch_));
    } else {
      RETURN_IF_ERROR(
          Gemm(h_.get<kernels::bf16_t>(), w_gate_up, gu_.get(), false, m, 2 * I, H, 0.f, T));
    }
    if (w_down != nullptr)
      RETURN_IF_ERROR(Gemm(act_.get<kernels::bf16_t>(), w_down, res, true, m, H, I, beta, T));
    if (m <= R && cuda::PlanLmHead(gemm_, m) == cuda::LmHeadPath::kPromptArgmax) {
      // (Its first launch sets the kernel's attributes: not inside a graph
      // capture.)
      CUDA_RETURN_IF_ERROR(kernels::LaunchPromptGemmArgmax(
          h_.get<kernels::bf16_t>(), lm_head_, logits_.get<float>(), nullptr, m, c.vocab_size, H,
          argmax_scratch_.get(), argmax_[0].get<int32_t>(), num_sms_, launch_));
    } else if (m <= R) {
      RETURN_IF_ERROR(Gemm(h_.get<kernels::bf16_t>(), lm_head_, logits_.get(), true, m,
                           c.vocab_size, H, 0.f, m <= B ? B : R));
    }
  }
  for (const int64_t last : {B, R}) {
    if (last >= T || (last == R && R == B)) continue;
    RETURN_IF_ERROR(Gemm(h_.get<kernels::bf16_t>(), lm_head_, logits_.get(), true,
                         static_cast<int>(last), c.vocab_size, H, 0.f, last));
  }
  if (options_.tuning.gemm_tune && T >= cuda::kTuneMinRows) {
    // The prompt steps' GEMMs, timed at anchors of 512, 1,024, ... rows and
    // the capacity (GemmTuner::Run takes the smallest anchor that covers a
    // step). The tensor cores draw power by the data they see and these
    // GEMMs run at the power limit, so the inputs are real weights (the
    // embedding's bytes), not whatever the workspaces held; every buffer
    // written here is written again by a step before it is read.
    const size_t eb = static_cast<size_t>(c.vocab_size) * H * 2;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_.get(), embed_, std::min(h_.bytes(), eb),
                                         cudaMemcpyDeviceToDevice, stream_));
    // Only the bf16 projections (QKV, gate_up): the o and down GEMMs'
    // tuned choice (fp32 added into the residual) timed faster here but ran
    // slower inside prompt steps (bench/RESULTS.md item 68).
    auto* h = h_.get<kernels::bf16_t>();
    // (Quantized projections: timed on their weights dequantized.)
    for (int64_t a = cuda::kTuneMinRows;; a *= 2) {
      const int m = static_cast<int>(std::min(a, T));
      if (const kernels::bf16_t* wqkv = bf16(L.wqkv, L.q_qkv, m, qkv_n, H); wqkv != nullptr) {
        if (wqkv == scratch) RETURN_IF_ERROR(Dequantize(L.q_qkv).status());
        RETURN_IF_ERROR(tuner_.Tune(cublas_, h, wqkv, qkv_.get(), false, m, qkv_n, H, 0.f));
      }
      const kernels::bf16_t* w_gate_up =
          dense != nullptr ? bf16(dense->w_gate_up, dense->q_gate_up, m, 2 * I, H) : nullptr;
      if (w_gate_up != nullptr && !cuda::UsePromptGemm(gemm_, m, 2 * I, H)) {
        if (w_gate_up == scratch) RETURN_IF_ERROR(Dequantize(dense->q_gate_up).status());
        RETURN_IF_ERROR(tuner_.Tune(cublas_, h, w_gate_up, gu_.get(), false, m, 2 * I, H, 0.f));
      }
      if (m == T) break;
    }
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  gemms_warm_tokens_ = cap_tokens_;
  return Status::Ok();
}

Status CudaBackend::EnsureCapacity(int64_t tokens, int64_t seqs,
                                   const std::array<int, kMaxCacheGroups>& width, int64_t rows) {
  bool fits = tokens <= cap_tokens_ && seqs <= cap_seqs_ && rows <= cap_rows_;
  for (int g = 0; g < kMaxCacheGroups; ++g) fits = fits && width[g] <= cap_width_[g];
  if (fits) return Status::Ok();
  ClearGraphs();
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(up_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(down_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  cap_seqs_ = std::max(cap_seqs_, seqs);
  cap_tokens_ = std::max({cap_tokens_, tokens, cap_seqs_});
  cap_rows_ = std::max({cap_rows_, rows, cap_seqs_, std::min<int64_t>(cap_tokens_, kMinLogitRows)});
  for (int g = 0; g < kMaxCacheGroups; ++g) cap_width_[g] = std::max(cap_width_[g], width[g]);
  cap_parts_ = std::max<int64_t>(4096, cap_seqs_);
  const model::ModelConfig& c = config_;
  const int64_t T = cap_tokens_, B = cap_seqs_, R = cap_rows_, H = c.hidden_size, D = c.head_dim;
  const int64_t nh = c.num_heads, nkv = c.num_kv_heads;
  // The dense MLP's workspaces only where some layer has one (GPT-OSS's
  // layers are all experts: its intermediate_size would size them for
  // nothing).
  bool dense_mlp = false;
  for (const Layer& l : layers_)
    dense_mlp = dense_mlp || l.w_gate_up != nullptr || l.q_gate_up.codes != nullptr;
  const int64_t I = dense_mlp ? c.intermediate_size : 0;
  struct Want {
    cuda::DeviceBuffer* buf;
    int64_t bytes;
  };
  const int64_t moe_e = c.moe.num_experts, moe_k = c.IsMoe() ? c.moe.experts_per_token : 0;
  int64_t meta = kMaxCacheGroups + 1 + 7 * T + 2 * B + 1;
  for (int g = 0; g < kMaxCacheGroups; ++g) meta += B * cap_width_[g];
  const Want wants[] = {
      {&h_, T * H * 2},
      {&qkv_, T * (nh + 2 * nkv) * D * 4},
      {&q_, T * nh * D * 2},
      {&k_, T * nkv * D * 2},
      {&v_, T * nkv * D * 2},
      {&attn_, T * nh * D * 2},
      // (Not past kMaxWgmmaRows rows where the prompt GEMM takes those.)
      {&gu_, (cuda::UsePromptGemm(gemm_, static_cast<int>(T), static_cast<int>(2 * I),
                                  static_cast<int>(H))
                  ? std::min<int64_t>(T, kernels::kMaxWgmmaRows)
                  : T) *
                 2 * I * 2},
      {&act_, T * I * 2},
      {&logits_, R * c.vocab_size * 4},
      {&argmax_[0], R * 4},
      {&argmax_[1], R * 4},
      {&argmax_scratch_, static_cast<int64_t>(std::max(
                             {kernels::ArgmaxScratchBytes(static_cast<int>(R)),
                              kernels::WgmmaArgmaxScratchBytes(
                                  static_cast<int>(std::min<int64_t>(R, kernels::kMaxWgmmaRows)),
                                  static_cast<int>(c.vocab_size)),
                              kernels::PromptArgmaxScratchBytes(static_cast<int>(R),
                                                                static_cast<int>(c.vocab_size))}))},
      {&part_o_, cap_parts_ * nh * D * 4},
      {&part_ml_, cap_parts_ * nh * 2 * 4},
      {&meta_[0], meta * 4},
      {&meta_[1], meta * 4},
      {&row_picks_[0], R * static_cast<int64_t>(sizeof(RowPick))},
      {&row_picks_[1], R * static_cast<int64_t>(sizeof(RowPick))},
      // Mixture of experts (0 bytes for dense models).
      {&moe_logits_, T * moe_e * 4},
      {&moe_experts_, T * moe_k * 4},
      {&moe_weights_, T * moe_k * 4},
      {&moe_plan_, c.IsMoe() ? (2 * (moe_e + 1) + 2 * T * moe_k) * 4 : 0},
      {&moe_act_, T * moe_k * c.moe.expert_intermediate * 2},
      {&moe_y_, T * moe_k * H * 4},
      {&row_lp_[0], R * static_cast<int64_t>(sizeof(RowLogprobs))},
      {&row_lp_[1], R * static_cast<int64_t>(sizeof(RowLogprobs))},
      {&row_lp_scratch_, static_cast<int64_t>(kernels::RowLogprobsScratchBytes(
                             static_cast<int>(R), static_cast<int>(c.vocab_size)))},
  };
  static_assert(kSlots == 2, "one entry per slot above");
  for (const Want& wt : wants) {
    RETURN_IF_ERROR(wt.buf->Allocate(static_cast<size_t>(wt.bytes)));
    if (wt.bytes == 0) continue;  // (the MoE workspaces of a dense model)
    // Padding rows of graph steps read what is there: never leave it undefined.
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(wt.buf->get(), 0, wt.bytes, stream_));
  }
  if (fp8()) {
    const size_t bytes = kernels::Fp8KvRowsBytes(T, static_cast<int>(nkv), static_cast<int>(D));
    RETURN_IF_ERROR(kv8_.Allocate(bytes));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv8_.get(), 0, bytes, stream_));
  }
  RETURN_IF_ERROR(PlaceReduceBuffers(/*allocate=*/true));
  // Tensor parallelism: one argmax key per logits row (forward_tp.cc).
  if (tp()) RETURN_IF_ERROR(tp_keys_.Allocate(static_cast<size_t>(B) * 8));
  for (int i = 0; i < kSlots; ++i) {
    RETURN_IF_ERROR(host_meta_[i].Allocate(static_cast<size_t>(meta) * 4));
    RETURN_IF_ERROR(host_tokens_[i].Allocate(static_cast<size_t>(R) * 4));
    RETURN_IF_ERROR(host_row_picks_[i].Allocate(static_cast<size_t>(R) * sizeof(RowPick)));
    RETURN_IF_ERROR(host_row_lp_[i].Allocate(static_cast<size_t>(R) * sizeof(RowLogprobs)));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

int64_t CudaBackend::ReduceWindowRows(int64_t tokens) const {
  const int64_t most = TpWindowTokens(config_);
  if (most <= 0 || tokens <= 0) return 0;
  // A GEMM of m rows may write GemmRows(m) (CublasRows at the buffer's
  // rows): room for those keeps every step's kernels as with the own
  // allocations.
  return std::min<int64_t>(tokens, cuda::GemmRows(static_cast<int>(most)));
}

size_t CudaBackend::ReduceWindowBytes(int64_t tokens) const {
  const int64_t rows = ReduceWindowRows(tokens);
  return rows > 0 ? TpReduceArenaFor(config_, rows).bytes : 0;
}

Status CudaBackend::PlaceReduceBuffers(bool allocate) {
  const size_t bytes = static_cast<size_t>(cap_tokens_) * config_.hidden_size * 4;
  if (allocate)
    for (cuda::ReduceBuffer* b : {&x_, &o_}) RETURN_IF_ERROR(b->Allocate(bytes));
  const int64_t rows = ReduceWindowRows(cap_tokens_);
  const TpReducePlacement p = PlaceTpReduce(config_, std::max<int64_t>(rows, 1),
                                            arena_ != nullptr && rows > 0 ? arena_bytes_ : 0);
  char* base = static_cast<char*>(arena_);
  x_.SetWindow(p.x_in_window ? base + p.x_offset : nullptr, p.buffer_bytes);
  o_.SetWindow(p.o_in_window ? base + p.o_offset : nullptr, p.buffer_bytes);
  // Padding rows of graph steps read what is there: never leave it undefined.
  for (cuda::ReduceBuffer* b : {&x_, &o_}) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->get(), 0, b->bytes(), stream_));
    if (b->has_window())
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->window(), 0, b->window_bytes(), stream_));
  }
  return Status::Ok();
}

bool CudaBackend::ReduceInWindow(int T) const {
  const size_t row = static_cast<size_t>(config_.hidden_size) * 4;
  return TpStepFromWindow(config_, T, static_cast<int64_t>(x_.window_bytes() / row));
}

void CudaBackend::SelectReduceBuffers(int T) {
  const bool window = ReduceInWindow(T);
  x_.UseWindow(window);
  o_.UseWindow(window);  // (no view: a model that never sums o apart)
}

Status CudaBackend::SetReduceArena(void* base, size_t bytes, bool fence) {
  ClearGraphs();
  for (cudaStream_t s : {up_stream_, down_stream_, stream_})
    if (s != nullptr) CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  arena_ = bytes > 0 ? base : nullptr;
  arena_bytes_ = arena_ != nullptr ? bytes : 0;
  reduce_fence_ = arena_ != nullptr && fence;
  if (cap_tokens_ == 0) return Status::Ok();  // placed when the workspaces are made
  RETURN_IF_ERROR(PlaceReduceBuffers(/*allocate=*/false));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

void CudaBackend::ClearGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

Status CudaBackend::CopyBlocks(std::span<const cache::KvBlockCopy> copies) {
  for (const cache::KvBlockCopy& c : copies) {
    if (c.group < 0 || c.group >= static_cast<int>(kv_.size()) || c.src < 0 || c.dst < 0 ||
        c.src >= layout_.blocks_per_group[c.group] || c.dst >= layout_.blocks_per_group[c.group])
      return InvalidArgument("CopyBlocks: block out of range");
    const size_t n = spec_.BytesPerBlock(c.group, layout_.block_size);
    std::byte* base = kv_[c.group].get<std::byte>();
    RETURN_IF_ERROR(WaitForReads(c.group, std::span<const int32_t>(&c.dst, 1)));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(base + n * c.dst, base + n * c.src, n, cudaMemcpyDeviceToDevice, stream_));
  }
  return Status::Ok();
}

Status CudaBackend::ReadBlock(int group, int32_t block, std::span<std::byte> out) {
  if (group < 0 || group >= static_cast<int>(kv_.size()) || block < 0 ||
      block >= layout_.blocks_per_group[group])
    return InvalidArgument("ReadBlock: block out of range");
  const size_t n = spec_.BytesPerBlock(group, layout_.block_size);
  if (out.size() != n) return InvalidArgument("ReadBlock: buffer size mismatch");
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), kv_[group].get<std::byte>() + n * block, n,
                                       cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Result<size_t> CudaBackend::CheckBlockBatch(const char* what, int group,
                                            std::span<const int32_t> blocks,
                                            size_t buffer_bytes) const {
  if (group < 0 || group >= static_cast<int>(kv_.size()))
    return InvalidArgument(std::string(what) + ": group out of range");
  const size_t n = spec_.BytesPerBlock(group, layout_.block_size);
  if (buffer_bytes != n * blocks.size())
    return InvalidArgument(std::string(what) + ": buffer size mismatch");
  for (int32_t b : blocks)
    if (b < 0 || b >= layout_.blocks_per_group[group])
      return InvalidArgument(std::string(what) + ": block out of range");
  return n;
}

Status CudaBackend::ReadBlocks(int group, std::span<const int32_t> blocks,
                               std::span<std::byte> out) {
  ASSIGN_OR_RETURN(const size_t n, CheckBlockBatch("ReadBlocks", group, blocks, out.size()));
  if (blocks.empty()) return Status::Ok();
  constexpr size_t kChunk = 64ull << 20;
  const size_t per = std::max<size_t>(1, kChunk / n);  // blocks per synchronisation
  const size_t want = std::min(per, blocks.size()) * n;
  if (read_staging_.bytes() < want) RETURN_IF_ERROR(read_staging_.Allocate(want));
  std::byte* staging = read_staging_.get<std::byte>();
  for (size_t first = 0; first < blocks.size(); first += per) {
    const size_t count = std::min(per, blocks.size() - first);
    for (size_t i = 0; i < count; ++i) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging + i * n,
                                           kv_[group].get<std::byte>() + n * blocks[first + i], n,
                                           cudaMemcpyDeviceToHost, stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::memcpy(out.data() + first * n, staging, count * n);
  }
  return Status::Ok();
}

Result<uint64_t> CudaBackend::StartReadBlocks(int group, std::span<const int32_t> blocks,
                                              std::span<std::byte> out) {
  ASSIGN_OR_RETURN(const size_t n, CheckBlockBatch("StartReadBlocks", group, blocks, out.size()));
  if (read_events_.empty()) {
    read_events_.resize(kReadEvents);
    for (cudaEvent_t& e : read_events_)
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  // The read sees the blocks as the steps launched so far leave them.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_mark_, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(read_stream_, compute_mark_, 0));
  RETURN_IF_ERROR(CopyBlockRuns(group, blocks, out.data(), n, /*to_host=*/true, read_stream_));
  const uint64_t ticket = next_read_ticket_++;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(read_events_[ticket % kReadEvents], read_stream_));
  read_hazards_->NoteRead(group, blocks, ticket);
  return ticket;
}

Status CudaBackend::CopyBlockRuns(int group, std::span<const int32_t> blocks, std::byte* host,
                                  size_t n, bool to_host, cudaStream_t stream) {
  runs_.clear();
  cuda::BlockRuns(blocks, &runs_);
  std::byte* base = kv_[group].get<std::byte>();
  batch_dst_.clear();
  batch_src_.clear();
  batch_bytes_.clear();
  for (const cuda::BlockRun& r : runs_) {
    std::byte* dev = base + n * static_cast<size_t>(r.first_block);
    std::byte* hst = host + n * static_cast<size_t>(r.first_index);
    batch_dst_.push_back(to_host ? hst : dev);
    batch_src_.push_back(to_host ? dev : hst);
    batch_bytes_.push_back(n * static_cast<size_t>(r.count));
  }
  if (runs_.size() > 1) {
    // One call for the whole batch: a call per block cost the engine thread
    // ~5 us each, 25 ms for 64 finished agents' blocks.
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    const cudaError_t rc =
        cudaMemcpyBatchAsync(batch_dst_.data(), batch_src_.data(), batch_bytes_.data(),
                             batch_dst_.size(), &attr, &attr_index, 1, stream);
    if (rc == cudaSuccess) return Status::Ok();
    // Not supported for these pointers (pageable memory on some drivers):
    // the error is not sticky; copy one run at a time below.
    (void)cudaGetLastError();
  }
  const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (size_t i = 0; i < batch_dst_.size(); ++i)
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(batch_dst_[i], batch_src_[i], batch_bytes_[i], kind, stream));
  return Status::Ok();
}

Status CudaBackend::WaitForReads(int group, std::span<const int32_t> blocks) {
  if (!read_hazards_) return Status::Ok();
  const uint64_t t = read_hazards_->PendingFor(group, blocks, reads_done_);
  // A ring slot recorded again since names a later read: waiting for it is
  // later than needed, never earlier.
  if (t > 0) CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, read_events_[t % kReadEvents], 0));
  return Status::Ok();
}

Result<bool> CudaBackend::ReadDone(uint64_t ticket, bool wait) {
  return TicketDone(read_events_, ticket, next_read_ticket_, &reads_done_, wait, "ReadDone");
}

Result<bool> CudaBackend::TicketDone(const std::vector<cudaEvent_t>& events, uint64_t ticket,
                                     uint64_t next, uint64_t* done, bool wait, const char* what) {
  if (ticket <= *done) return true;
  if (ticket >= next) return InvalidArgument(std::string(what) + ": unknown ticket");
  cudaEvent_t e = events[ticket % events.size()];
  if (wait) {
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e));
  } else {
    const cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaErrorNotReady) return false;
    CUDA_RETURN_IF_ERROR(rc);
  }
  *done = ticket;  // one stream: earlier tickets finished first
  return true;
}

Result<uint64_t> CudaBackend::StartWriteBlocks(int group, std::span<const int32_t> blocks,
                                               std::span<const std::byte> in) {
  ASSIGN_OR_RETURN(const size_t n, CheckBlockBatch("StartWriteBlocks", group, blocks, in.size()));
  if (write_events_.empty()) {
    write_events_.resize(kWriteEvents);
    for (cudaEvent_t& e : write_events_)
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  RETURN_IF_ERROR(WaitForReads(group, blocks));
  if (Status st = CopyBlockRuns(group, blocks, const_cast<std::byte*>(in.data()), n,
                                /*to_host=*/false, stream_);
      !st.ok()) {
    // Runs issued before the failure must not read `in` once we return.
    (void)cudaStreamSynchronize(stream_);
    return st;
  }
  const uint64_t ticket = next_write_ticket_++;
  if (const cudaError_t rc = cudaEventRecord(write_events_[ticket % kWriteEvents], stream_);
      rc != cudaSuccess) {
    (void)cudaStreamSynchronize(stream_);
    CUDA_RETURN_IF_ERROR(rc);
  }
  return ticket;
}

Result<bool> CudaBackend::WriteDone(uint64_t ticket, bool wait) {
  return TicketDone(write_events_, ticket, next_write_ticket_, &writes_done_, wait, "WriteDone");
}

Status CudaBackend::WriteBlock(int group, int32_t block, std::span<const std::byte> in) {
  if (group < 0 || group >= static_cast<int>(kv_.size()) || block < 0 ||
      block >= layout_.blocks_per_group[group])
    return InvalidArgument("WriteBlock: block out of range");
  const size_t n = spec_.BytesPerBlock(group, layout_.block_size);
  if (in.size() != n) return InvalidArgument("WriteBlock: buffer size mismatch");
  RETURN_IF_ERROR(WaitForReads(group, std::span<const int32_t>(&block, 1)));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(kv_[group].get<std::byte>() + n * block, in.data(), n,
                                       cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaBackend::WriteBlocks(int group, std::span<const int32_t> blocks,
                                std::span<const std::byte> in) {
  ASSIGN_OR_RETURN(const size_t n, CheckBlockBatch("WriteBlocks", group, blocks, in.size()));
  RETURN_IF_ERROR(WaitForReads(group, blocks));
  RETURN_IF_ERROR(CopyBlockRuns(group, blocks, const_cast<std::byte*>(in.data()), n,
                                /*to_host=*/false, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Result<HostBuffer> CudaBackend::AllocateHostBuffer(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return HostBuffer(static_cast<std::byte*>(p), bytes, [](std::byte* q) {
    if (q != nullptr) cudaFreeHost(q);
  });
}

Status CudaBackend::CheckBatch(std::span<const SeqStep> batch) const {
  if (kv_.empty()) return InvalidArgument("Forward: KV storage not allocated");
  return CheckSteps(batch, tp() ? tp_check_config_ : config_, spec_, layout_,
                    /*allow_prev_row=*/true, /*allow_multi_rows=*/true);
}

cuda::GemmModel CudaBackend::MakeGemmModel() const {
  const model::ModelConfig& c = config_;
  const CudaTuning& t = options_.tuning;
  cuda::GemmModel g;
  g.hidden = c.hidden_size;
  g.qkv_n = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  g.attn_n = c.num_heads * c.head_dim;
  g.inter = c.intermediate_size;
  g.vocab = c.vocab_size;
  g.num_sms = num_sms_;
  g.wgmma_min_rows = wgmma_min_rows_;
  g.prompt_gemm = t.prompt_gemm && kernels::PromptGemmDeviceSupported();
  g.lm_argmax = t.lm_argmax;
  g.prompt_argmax = t.prompt_argmax;
  g.gemv_pipe = t.gemv_pipe;
  g.softcap = c.final_logit_softcap > 0.f;
  g.sandwich_norm = c.sandwich_norm;
  g.tp = tp();
  g.quant_dequant = dequant_.bytes() > 0;
  g.quant_gemv = t.moe_gemv;
  g.gelu_mlp = c.activation == model::Activation::kGeluTanh;
  return g;
}

Status CudaBackend::ResidualGemm(const kernels::bf16_t* a, const kernels::bf16_t* w, int m, int n,
                                 int k, cuda::ResidualPath path, int planes) {
  switch (path) {
    case cuda::ResidualPath::kPlanes:
      // The plan counts on the norm before this projection having added
      // the last planes (one buffer holds one projection's).
      if (pending_planes_ != 0) return Internal("cuda: split-K planes still pending");
      CUDA_RETURN_IF_ERROR(kernels::LaunchWgmmaGemm(a, w, wgmma_planes_.get(), true, m, n, k, 0.f,
                                                    {wgmma_ws_.get(), num_sms_}, launch_, -1,
                                                    true));
      pending_planes_ = planes;
      plane_floats_ = static_cast<int64_t>(m) * n;
      return Status::Ok();
    case cuda::ResidualPath::kGemmPartial:
      // A partial sum, all-reduced next (TpReduce): rank 0 adds the
      // residual, the others start from zero.
      return Gemm(a, w, x_.get<float>(), true, m, n, k, options_.tp_comm.rank() == 0 ? 1.f : 0.f,
                  cap_tokens_);
    case cuda::ResidualPath::kGemmOut:
      return Gemm(a, w, o_.get<float>(), true, m, n, k, 0.f, cap_tokens_);
    case cuda::ResidualPath::kGemmAdd:
      break;
  }
  return Gemm(a, w, x_.get<float>(), true, m, n, k, 1.f, cap_tokens_);
}

Status CudaBackend::Norm(const int32_t* rows, const float* norm_w, int m) {
  const model::ModelConfig& c = config_;
  auto* h = h_.get<kernels::bf16_t>();
  float* x = x_.get<float>();
  if (pending_planes_ > 0) {
    CUDA_RETURN_IF_ERROR(kernels::LaunchAddPartsRmsNorm(
        x, wgmma_planes_.get<float>(), pending_planes_, plane_floats_, rows, norm_w, h, m,
        c.hidden_size, c.rms_norm_eps, c.gemma_norm, launch_));
    pending_planes_ = 0;
    return Status::Ok();
  }
  CUDA_RETURN_IF_ERROR(kernels::LaunchRmsNorm(x, rows, norm_w, h, m, c.hidden_size, c.rms_norm_eps,
                                              c.gemma_norm, launch_));
  return Status::Ok();
}

Status CudaBackend::Gemm(const kernels::bf16_t* x, const kernels::bf16_t* w, void* y, bool y_f32,
                         int m, int n, int k, float beta, int64_t max_rows) {
  if (m <= 0) return Status::Ok();
  switch (cuda::ChooseGemm(gemm_, m, n, k)) {
    case cuda::GemmKernel::kGemv:
      CUDA_RETURN_IF_ERROR(kernels::LaunchGemv(x, w, y, y_f32, m, n, k, beta, num_sms_, launch_,
                                               options_.tuning.gemv_pipe));
      return Status::Ok();
    case cuda::GemmKernel::kWgmma:
      CUDA_RETURN_IF_ERROR(kernels::LaunchWgmmaGemm(x, w, y, y_f32, m, n, k, beta,
                                                    {wgmma_ws_.get(), num_sms_}, launch_));
      return Status::Ok();
    case cuda::GemmKernel::kCublas:
      break;
  }
  const int rows = cuda::CublasRows(m, max_rows);
  if (rows >= cuda::kTuneMinRows) {
    bool ran = false;
    RETURN_IF_ERROR(tuner_.Run(x, w, y, y_f32, rows, n, k, beta, &ran));
    if (ran) return Status::Ok();
  }
  CUBLAS_RETURN_IF_ERROR(cuda::GemmTuner::Default(cublas_, x, w, y, y_f32, rows, n, k, beta));
  return Status::Ok();
}

}  // namespace agentkv::backend::cuda
