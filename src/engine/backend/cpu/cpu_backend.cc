#include "engine/backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "engine/backend/cpu/cpu_attention.h"
#include "engine/backend/cpu/cpu_kernels.h"
#include "engine/backend/kv_fp8.h"
#include "engine/backend/rope.h"

namespace agentkv::backend::cpu {

struct CpuBackend::Layer {
  std::vector<float> in_norm, post_attn_norm, pre_ff_norm, post_ff_norm;
  std::vector<float> wqkv, bqkv;  // [q | k | v] rows, fused into one GEMM
  std::vector<float> q_norm, k_norm;
  std::vector<float> wo, bo;
  std::vector<float> sinks;      // per query head, or empty
  std::vector<float> w_gate_up;  // [gate | up] rows, fused into one GEMM
  std::vector<float> w_down;
  // Quantized checkpoints: the same four matrices kept quantized (the fp32
  // vectors above stay empty); engine/backend/cpu/cpu_quant_matmul.h.
  QuantMatrix q_wqkv, q_wo, q_w_gate_up, q_w_down;
  bool moe = false;
  MoeLayerWeights experts;
  cache::AttentionKind kind = cache::AttentionKind::kFull;
  int window = 0;
  int group = 0;
  int index_in_group = 0;
};

namespace {

Status Append(std::vector<float>& dst, const model::WeightSource& w, const std::string& name,
              std::initializer_list<int64_t> shape) {
  std::vector<int64_t> s(shape);
  ASSIGN_OR_RETURN(std::vector<float> t, w.LoadF32(name, s));
  dst.insert(dst.end(), t.begin(), t.end());
  return Status::Ok();
}

// A linear weight [out, in], appended to a stacked matrix: kept quantized
// when the checkpoint stores it so (then `q` holds the whole stack, earlier
// fp32 parts moved into it), else fp32 rows in `dst`.
Status AppendLinear(std::vector<float>& dst, QuantMatrix& q, const model::WeightSource& w,
                    const model::QuantConfig& quant, const std::string& name, int64_t out,
                    int64_t in) {
  const std::vector<int64_t> shape = {out, in};
  if (w.IsQuantized(name)) {
    ASSIGN_OR_RETURN(model::QuantizedWeight qw, w.LoadQuantized(name, shape, quant));
    if (q.empty() && !dst.empty()) {
      const int64_t rows = static_cast<int64_t>(dst.size()) / in;
      RETURN_IF_ERROR(q.AppendF32(std::move(dst), rows, in));
      dst.clear();
    }
    return q.Append(std::move(qw)).WithContext(name);
  }
  if (!q.empty()) {
    ASSIGN_OR_RETURN(std::vector<float> t, w.LoadF32(name, shape));
    return q.AppendF32(std::move(t), out, in).WithContext(name);
  }
  return Append(dst, w, name, {out, in});
}

}  // namespace

CpuBackend::CpuBackend(const model::ModelConfig& config, const CpuBackendOptions& options)
    : config_(config), options_(options) {}

CpuBackend::~CpuBackend() = default;

Result<std::unique_ptr<CpuBackend>> CpuBackend::Create(const model::ModelConfig& config,
                                                       const model::WeightSource& weights,
                                                       const CpuBackendOptions& options) {
  if (config.num_layers <= 0 || config.hidden_size <= 0 || config.num_heads <= 0 ||
      config.num_kv_heads <= 0 || config.head_dim <= 0 || config.vocab_size <= 0 ||
      config.num_heads % config.num_kv_heads != 0 || config.head_dim % 2 != 0 ||
      config.head_dim > 1024) {
    return InvalidArgument("cpu backend: unsupported model shape");
  }
  if (config.IsMoe() &&
      (config.moe.num_experts > 1024 || config.moe.experts_per_token <= 0 ||
       config.moe.experts_per_token > config.moe.num_experts ||
       config.moe.expert_intermediate <= 0 || config.moe.decoder_sparse_step <= 0))
    return InvalidArgument(
        "cpu backend: unsupported mixture-of-experts shape (at most 1024 "
        "experts, 1 <= experts per token <= experts)");
  if (options.kv_dtype != cache::KvDtype::kF32 && options.kv_dtype != cache::KvDtype::kFP8E4M3)
    return InvalidArgument(std::string("cpu backend: KV dtype ") +
                           cache::KvDtypeName(options.kv_dtype) +
                           " is not supported (f32 or fp8_e4m3)");
  std::unique_ptr<CpuBackend> b(new CpuBackend(config, options));
  b->spec_ = config.CacheSpec(options.kv_dtype);
  if (static_cast<int>(b->spec_.groups.size()) > kMaxCacheGroups)
    return InvalidArgument("cpu backend: too many cache groups");
  RETURN_IF_ERROR(b->LoadWeights(weights));
  b->inv_freq_global_ = RopeInvFreq(config.rope, config.head_dim);
  b->inv_freq_local_ = RopeInvFreq(config.rope_local, config.head_dim);
  b->rope_scale_ = RopeAttentionFactor(config.rope);
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  b->options_.threads = threads;
  b->pool_ = std::make_unique<ThreadPool>(threads);
  b->scores_.resize(threads);
  if (b->fp8())
    b->deq_.assign(threads,
                   std::vector<float>(static_cast<size_t>(2) * kDeqRing * config.head_dim));
  return b;
}

Status CpuBackend::LoadWeights(const model::WeightSource& w) {
  const model::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t nq = c.num_heads * D, nkv = c.num_kv_heads * D;
  const std::vector<int64_t> vh = {c.vocab_size, H};
  if (auto e = w.LoadBf16IfStored("model.embed_tokens.weight", vh); e.ok()) {
    embed_bf16_ = std::move(e).value();
  } else {
    RETURN_IF_ERROR(Append(embed_, w, "model.embed_tokens.weight", {c.vocab_size, H}));
  }
  RETURN_IF_ERROR(Append(final_norm_, w, "model.norm.weight", {H}));
  if (!c.tie_word_embeddings) {
    if (auto e = w.LoadBf16IfStored("lm_head.weight", vh); e.ok()) {
      lm_head_bf16_ = std::move(e).value();
    } else {
      RETURN_IF_ERROR(Append(lm_head_, w, "lm_head.weight", {c.vocab_size, H}));
    }
  }
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    RETURN_IF_ERROR(Append(L.in_norm, w, p + "input_layernorm.weight", {H}));
    RETURN_IF_ERROR(Append(L.post_attn_norm, w, p + "post_attention_layernorm.weight", {H}));
    if (c.sandwich_norm) {
      RETURN_IF_ERROR(Append(L.pre_ff_norm, w, p + "pre_feedforward_layernorm.weight", {H}));
      RETURN_IF_ERROR(Append(L.post_ff_norm, w, p + "post_feedforward_layernorm.weight", {H}));
    }
    RETURN_IF_ERROR(
        AppendLinear(L.wqkv, L.q_wqkv, w, c.quant, p + "self_attn.q_proj.weight", nq, H));
    RETURN_IF_ERROR(
        AppendLinear(L.wqkv, L.q_wqkv, w, c.quant, p + "self_attn.k_proj.weight", nkv, H));
    RETURN_IF_ERROR(
        AppendLinear(L.wqkv, L.q_wqkv, w, c.quant, p + "self_attn.v_proj.weight", nkv, H));
    if (c.attention_bias) {
      RETURN_IF_ERROR(Append(L.bqkv, w, p + "self_attn.q_proj.bias", {nq}));
      RETURN_IF_ERROR(Append(L.bqkv, w, p + "self_attn.k_proj.bias", {nkv}));
      RETURN_IF_ERROR(Append(L.bqkv, w, p + "self_attn.v_proj.bias", {nkv}));
    }
    if (c.qk_norm) {
      RETURN_IF_ERROR(Append(L.q_norm, w, p + "self_attn.q_norm.weight", {D}));
      RETURN_IF_ERROR(Append(L.k_norm, w, p + "self_attn.k_norm.weight", {D}));
    }
    RETURN_IF_ERROR(AppendLinear(L.wo, L.q_wo, w, c.quant, p + "self_attn.o_proj.weight", H, nq));
    if (c.o_proj_bias) RETURN_IF_ERROR(Append(L.bo, w, p + "self_attn.o_proj.bias", {H}));
    if (c.attention_sinks)
      RETURN_IF_ERROR(Append(L.sinks, w, p + "self_attn.sinks", {c.num_heads}));
    L.moe = c.IsMoeLayer(l);
    if (L.moe) {
      RETURN_IF_ERROR(LoadMoeLayer(c, w, l, &L.experts));
    } else {
      RETURN_IF_ERROR(
          AppendLinear(L.w_gate_up, L.q_w_gate_up, w, c.quant, p + "mlp.gate_proj.weight", I, H));
      RETURN_IF_ERROR(
          AppendLinear(L.w_gate_up, L.q_w_gate_up, w, c.quant, p + "mlp.up_proj.weight", I, H));
      RETURN_IF_ERROR(
          AppendLinear(L.w_down, L.q_w_down, w, c.quant, p + "mlp.down_proj.weight", H, I));
    }
    L.kind = c.layer_kinds.at(l);
    L.window = c.layer_windows.at(l);
    L.group = spec_.GroupOf(l);
    L.index_in_group = spec_.IndexInGroup(l);
  }
  auto f32 = [](const std::vector<float>& v) { return v.size() * sizeof(float); };
  weight_bytes_ = f32(embed_) + f32(final_norm_) + f32(lm_head_) +
                  (embed_bf16_.size() + lm_head_bf16_.size()) * sizeof(uint16_t);
  for (const Layer& L : layers_) {
    for (const auto* v :
         {&L.in_norm, &L.post_attn_norm, &L.pre_ff_norm, &L.post_ff_norm, &L.wqkv, &L.bqkv,
          &L.q_norm, &L.k_norm, &L.wo, &L.bo, &L.sinks, &L.w_gate_up, &L.w_down})
      weight_bytes_ += f32(*v);
    for (const auto* q : {&L.q_wqkv, &L.q_wo, &L.q_w_gate_up, &L.q_w_down})
      weight_bytes_ += q->bytes();
    if (L.moe) weight_bytes_ += L.experts.bytes();
  }
  return Status::Ok();
}

Status CpuBackend::AllocateKv(const KvLayout& layout) {
  if (layout.block_size <= 0) return InvalidArgument("block_size must be positive");
  layout_ = layout;
  kv_.clear();
  for (size_t g = 0; g < spec_.groups.size(); ++g) {
    const size_t bytes = spec_.BytesPerBlock(static_cast<int>(g), layout.block_size) *
                         static_cast<size_t>(layout.blocks_per_group[g]);
    ASSIGN_OR_RETURN(ZeroedBuffer b, ZeroedBuffer::Allocate(bytes));
    kv_.push_back(std::move(b));
  }
  return Status::Ok();
}

float* CpuBackend::KvPtr(int group, int32_t block, int layer_in_group, int which,
                         int offset) const {
  const int64_t L = static_cast<int64_t>(spec_.groups[group].layers.size());
  const int64_t row = static_cast<int64_t>(spec_.num_kv_heads) * spec_.head_dim;
  const int64_t idx =
      (((static_cast<int64_t>(block) * L + layer_in_group) * 2 + which) * layout_.block_size +
       offset) *
      row;
  return kv_[group].as<float>() + idx;
}

std::byte* CpuBackend::BlockBytes(int group, int32_t block) const {
  return kv_[group].data() +
         static_cast<size_t>(block) * spec_.BytesPerBlock(group, layout_.block_size);
}

uint8_t* CpuBackend::Fp8Section(int group, int32_t block, int layer_in_group, int which) const {
  const int64_t section =
      kvfp8::SectionBytes(layout_.block_size, spec_.num_kv_heads, spec_.head_dim);
  return reinterpret_cast<uint8_t*>(BlockBytes(group, block)) +
         (static_cast<int64_t>(layer_in_group) * 2 + which) * section;
}

void CpuBackend::QuantizeStepKv(int64_t t) {
  const int D = config_.head_dim, nh = config_.num_heads, nkv = config_.num_kv_heads;
  float* k =
      qkv_.data() + t * static_cast<int64_t>(nh + 2 * nkv) * D + static_cast<int64_t>(nh) * D;
  for (int r = 0; r < 2 * nkv; ++r) {  // K heads, then V heads, as in qkv_
    float* row = k + static_cast<int64_t>(r) * D;
    uint8_t* q = kv8_.data() + (t * 2 * nkv + r) * D;
    const float scale = kvfp8::QuantizeRow(row, D, q);
    kv8_scale_[t * 2 * nkv + r] = scale;
    kvfp8::DequantizeRow(q, scale, D, row);
  }
}

Status CpuBackend::CopyBlocks(std::span<const cache::KvBlockCopy> copies) {
  for (const cache::KvBlockCopy& c : copies) {
    if (c.group < 0 || c.group >= static_cast<int>(kv_.size()) || c.src < 0 || c.dst < 0 ||
        c.src >= layout_.blocks_per_group[c.group] || c.dst >= layout_.blocks_per_group[c.group])
      return InvalidArgument("CopyBlocks: block out of range");
    const size_t n = spec_.BytesPerBlock(c.group, layout_.block_size);
    std::memcpy(BlockBytes(c.group, c.dst), BlockBytes(c.group, c.src), n);
  }
  return Status::Ok();
}

Status CpuBackend::ReadBlock(int group, int32_t block, std::span<std::byte> out) {
  if (group < 0 || group >= static_cast<int>(kv_.size()) || block < 0 ||
      block >= layout_.blocks_per_group[group])
    return InvalidArgument("ReadBlock: block out of range");
  const size_t n = spec_.BytesPerBlock(group, layout_.block_size);
  if (out.size() != n) return InvalidArgument("ReadBlock: buffer size mismatch");
  std::memcpy(out.data(), BlockBytes(group, block), n);
  return Status::Ok();
}

Status CpuBackend::WriteBlock(int group, int32_t block, std::span<const std::byte> in) {
  if (group < 0 || group >= static_cast<int>(kv_.size()) || block < 0 ||
      block >= layout_.blocks_per_group[group])
    return InvalidArgument("WriteBlock: block out of range");
  const size_t n = spec_.BytesPerBlock(group, layout_.block_size);
  if (in.size() != n) return InvalidArgument("WriteBlock: buffer size mismatch");
  std::memcpy(BlockBytes(group, block), in.data(), n);
  return Status::Ok();
}

Status CpuBackend::CheckBatch(std::span<const SeqStep> batch) const {
  if (kv_.empty()) return InvalidArgument("Forward: KV storage not allocated");
  return CheckSteps(batch, config_, spec_, layout_, /*allow_prev_row=*/false,
                    /*allow_multi_rows=*/true);
}

void CpuBackend::EnsureScratch(int64_t tokens, int64_t max_keys) {
  const model::ModelConfig& c = config_;
  if (tokens > cap_tokens_) {
    cap_tokens_ = std::max<int64_t>(tokens, 64);
    const int64_t T = cap_tokens_, H = c.hidden_size, D = c.head_dim;
    x_.resize(T * H);
    h_.resize(T * H);
    qkv_.resize(T * (c.num_heads + 2 * c.num_kv_heads) * D);
    attn_.resize(T * c.num_heads * D);
    o_.resize(T * H);
    gu_.resize(T * 2 * c.intermediate_size);
    act_.resize(T * c.intermediate_size);
    last_.resize(T * H);
    tok_seq_.resize(T);
    tok_pos_.resize(T);
    if (fp8()) {
      kv8_.resize(T * 2 * c.num_kv_heads * D);
      kv8_scale_.resize(T * 2 * c.num_kv_heads);
    }
  }
  if (max_keys > cap_keys_) {
    const int rows = kQueryTile * (c.num_heads / c.num_kv_heads);
    cap_keys_ = std::max<int64_t>(max_keys, kernels::AttendRowsScratch(rows, c.head_dim));
    for (auto& s : scores_) s.resize(cap_keys_);
    attn_rows_.resize(scores_.size());
    for (auto& r : attn_rows_) r.resize(rows);
  }
}

void CpuBackend::Attention(int layer, std::span<const SeqStep> batch) {
  const model::ModelConfig& c = config_;
  const Layer& L = layers_[layer];
  const int D = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int group_size = nh / nkv;
  const int64_t qkv_row = static_cast<int64_t>(nh + 2 * nkv) * D;
  const float scale = c.AttentionScale();
  const float softcap = c.attn_logit_softcap;
  const int bs = layout_.block_size;
  const int ring = spec_.RingBlocks(L.group, bs);

  // One work item per (run of up to kQueryTile tokens of one sequence, KV
  // head): its rows are those tokens times the query heads of that KV head,
  // and each key tile is loaded once for all of them.
  chunks_.clear();
  for (size_t s = 0; s < batch.size(); ++s)
    for (int64_t t = seq_first_[s]; t < seq_first_[s + 1]; t += kQueryTile)
      chunks_.push_back({static_cast<int>(s), t, std::min(seq_first_[s + 1], t + kQueryTile)});
  const int64_t items = static_cast<int64_t>(chunks_.size()) * nkv;
  pool_->ParallelFor(items, 1, [&](int64_t it, int thread) {
    const Chunk& ch = chunks_[it / nkv];
    const int kvh = static_cast<int>(it % nkv);
    const SeqStep& st = batch[ch.seq];
    const int64_t first = seq_first_[ch.seq];
    const std::span<const int32_t> table = st.block_tables[L.group];
    auto key_at = [&](int which, int32_t p) -> const float* {
      if (p >= st.start_pos) {  // computed this step
        const int64_t row = first + (p - st.start_pos);
        return qkv_.data() + row * qkv_row + static_cast<int64_t>(nh + which * nkv + kvh) * D;
      }
      const int32_t lb = p / bs;
      const int32_t blk = table[ring > 0 ? lb % ring : lb];
      if (!fp8())
        return KvPtr(L.group, blk, L.index_in_group, which, p % bs) + static_cast<int64_t>(kvh) * D;
      // Dequantized into this thread's ring: the kernels read a key at
      // once and hold at most kKeyTile values rows, all of distinct slots.
      const uint8_t* sec = Fp8Section(L.group, blk, L.index_in_group, which);
      const int64_t r = static_cast<int64_t>(p % bs) * nkv + kvh;
      float scale;
      std::memcpy(&scale, sec + kvfp8::ScalesOffset(bs, nkv, D) + r * 4, 4);
      float* out =
          deq_[thread].data() + (static_cast<int64_t>(which) * kDeqRing + p % kDeqRing) * D;
      kvfp8::DequantizeRow(sec + r * D, scale, D, out);
      return out;
    };
    if (D % 8 != 0) {  // the reference path, one (token, head) at a time
      for (int64_t t = ch.begin; t < ch.end; ++t) {
        const int32_t pos = tok_pos_[t];
        const int32_t lo = L.window > 0 ? std::max(0, pos - L.window + 1) : 0;
        for (int h = kvh * group_size; h < (kvh + 1) * group_size; ++h) {
          kernels::AttendOne(
              qkv_.data() + t * qkv_row + static_cast<int64_t>(h) * D, pos - lo + 1, D, scale,
              softcap, [&](int j) { return key_at(0, lo + j); },
              [&](int j) { return key_at(1, lo + j); }, scores_[thread].data(),
              attn_.data() + (t * nh + h) * D, L.sinks.empty() ? -INFINITY : L.sinks[h]);
        }
      }
      return;
    }
    kernels::AttnRow* rows = attn_rows_[thread].data();
    int n = 0;
    for (int64_t t = ch.begin; t < ch.end; ++t) {
      const int32_t pos = tok_pos_[t];
      const int32_t lo = L.window > 0 ? std::max(0, pos - L.window + 1) : 0;
      for (int h = kvh * group_size; h < (kvh + 1) * group_size; ++h) {
        rows[n++] = kernels::AttnRow{qkv_.data() + t * qkv_row + static_cast<int64_t>(h) * D,
                                     attn_.data() + (t * nh + h) * D, pos, lo,
                                     L.sinks.empty() ? -INFINITY : L.sinks[h]};
      }
    }
    kernels::AttendRows(
        rows, n, D, scale, softcap, [&](int32_t p) { return key_at(0, p); },
        [&](int32_t p) { return key_at(1, p); }, scores_[thread].data());
  });
}

void CpuBackend::WriteKv(int layer, std::span<const SeqStep> batch) {
  const model::ModelConfig& c = config_;
  const Layer& L = layers_[layer];
  const int D = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t qkv_row = static_cast<int64_t>(nh + 2 * nkv) * D;
  const int bs = layout_.block_size;
  const int ring = spec_.RingBlocks(L.group, bs);
  const int64_t T = seq_first_.back();
  for (int64_t t = 0; t < T; ++t) {
    const SeqStep& st = batch[tok_seq_[t]];
    const int32_t p = tok_pos_[t];
    const int32_t lb = p / bs;
    const int32_t blk = st.block_tables[L.group][ring > 0 ? lb % ring : lb];
    if (fp8()) {
      const int64_t row = static_cast<int64_t>(p % bs) * nkv;
      for (int which = 0; which < 2; ++which) {
        uint8_t* sec = Fp8Section(L.group, blk, L.index_in_group, which);
        std::memcpy(sec + row * D, kv8_.data() + (t * 2 + which) * nkv * D,
                    static_cast<size_t>(nkv) * D);
        std::memcpy(sec + kvfp8::ScalesOffset(bs, nkv, D) + row * 4,
                    kv8_scale_.data() + (t * 2 + which) * nkv, sizeof(float) * nkv);
      }
      continue;
    }
    for (int which = 0; which < 2; ++which) {
      std::memcpy(KvPtr(L.group, blk, L.index_in_group, which, p % bs),
                  qkv_.data() + t * qkv_row + static_cast<int64_t>(nh + which * nkv) * D,
                  sizeof(float) * nkv * D);
    }
  }
}

Status CpuBackend::Forward(std::span<const SeqStep> batch, std::span<float> logits) {
  ForgetKeptLogits();  // a step's logits rows go where this one's go
  RETURN_IF_ERROR(CheckBatch(batch));
  const model::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int nh = c.num_heads, nkv = c.num_kv_heads;
  const int64_t qkv_row = static_cast<int64_t>(nh + 2 * nkv) * D;

  int64_t T = 0, want = 0, max_keys = 1;
  for (const SeqStep& st : batch) {
    T += st.tokens.size();
    want += LogitRows(st);
    max_keys = std::max<int64_t>(max_keys, st.start_pos + st.tokens.size());
  }
  if (static_cast<int64_t>(logits.size()) < want * c.vocab_size)
    return InvalidArgument("Forward: logits buffer too small");
  if (T == 0) return Status::Ok();
  EnsureScratch(T, max_keys);
  openblas_set_num_threads(options_.threads);

  seq_first_.clear();
  int64_t t = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    seq_first_.push_back(t);
    for (size_t i = 0; i < batch[s].tokens.size(); ++i, ++t) {
      tok_seq_[t] = static_cast<int32_t>(s);
      tok_pos_[t] = batch[s].start_pos + static_cast<int32_t>(i);
      const int64_t row = static_cast<int64_t>(batch[s].tokens[i]) * H;
      if (embed_bf16_.empty()) {
        std::memcpy(&x_[t * H], &embed_[row], sizeof(float) * H);
      } else {
        for (int64_t d = 0; d < H; ++d) {
          const uint32_t u = static_cast<uint32_t>(embed_bf16_[row + d]) << 16;
          std::memcpy(&x_[t * H + d], &u, 4);
        }
      }
    }
  }
  seq_first_.push_back(T);
  if (c.embed_scale != 1.0f)
    for (int64_t i = 0; i < T * H; ++i) x_[i] *= c.embed_scale;

  const bool plus_one = c.gemma_norm;
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    kernels::RmsNorm(x_.data(), L.in_norm.data(), h_.data(), T, H, c.rms_norm_eps, plus_one);
    DenseLinear(h_.data(), L.wqkv, L.q_wqkv, L.bqkv.empty() ? nullptr : L.bqkv.data(), qkv_.data(),
                T, qkv_row, H, pool_.get(), qscratch_);
    // Only Gemma 3 gives sliding layers their own rotary base.
    const float* inv_freq =
        L.kind == cache::AttentionKind::kSliding && c.arch == model::Architecture::kGemma3
            ? inv_freq_local_.data()
            : inv_freq_global_.data();
    pool_->ParallelFor(T, 8, [&](int64_t i, int) {
      float* q = qkv_.data() + i * qkv_row;
      float* k = q + static_cast<int64_t>(nh) * D;
      if (c.qk_norm) {
        kernels::RmsNorm(q, L.q_norm.data(), q, nh, static_cast<int>(D), c.rms_norm_eps, plus_one);
        kernels::RmsNorm(k, L.k_norm.data(), k, nkv, static_cast<int>(D), c.rms_norm_eps, plus_one);
      }
      kernels::ApplyRope(q, nh, static_cast<int>(D), tok_pos_[i], inv_freq, rope_scale_);
      kernels::ApplyRope(k, nkv, static_cast<int>(D), tok_pos_[i], inv_freq, rope_scale_);
      if (fp8()) QuantizeStepKv(i);
    });
    Attention(l, batch);
    WriteKv(l, batch);
    DenseLinear(attn_.data(), L.wo, L.q_wo, L.bo.empty() ? nullptr : L.bo.data(), o_.data(), T, H,
                static_cast<int64_t>(nh) * D, pool_.get(), qscratch_);
    if (c.sandwich_norm) {
      kernels::RmsNorm(o_.data(), L.post_attn_norm.data(), o_.data(), T, H, c.rms_norm_eps,
                       plus_one);
      for (int64_t i = 0; i < T * H; ++i) x_[i] += o_[i];
      kernels::RmsNorm(x_.data(), L.pre_ff_norm.data(), h_.data(), T, H, c.rms_norm_eps, plus_one);
    } else {
      for (int64_t i = 0; i < T * H; ++i) x_[i] += o_[i];
      kernels::RmsNorm(x_.data(), L.post_attn_norm.data(), h_.data(), T, H, c.rms_norm_eps,
                       plus_one);
    }
    if (L.moe) {
      moe_.Forward(c, L.experts, h_.data(), o_.data(), T, pool_.get());
    } else {
      DenseLinear(h_.data(), L.w_gate_up, L.q_w_gate_up, nullptr, gu_.data(), T, 2 * I, H,
                  pool_.get(), qscratch_);
      kernels::GatedActivation(gu_.data(), act_.data(), T, static_cast<int>(I), c.activation);
      DenseLinear(act_.data(), L.w_down, L.q_w_down, nullptr, o_.data(), T, H, I, pool_.get(),
                  qscratch_);
    }
    if (c.sandwich_norm) {
      kernels::RmsNorm(o_.data(), L.post_ff_norm.data(), o_.data(), T, H, c.rms_norm_eps, plus_one);
    }
    for (int64_t i = 0; i < T * H; ++i) x_[i] += o_[i];
  }

  if (want == 0) return Status::Ok();
  int64_t r = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const int32_t rows = LogitRows(batch[s]);
    if (rows == 0) continue;
    const int64_t row = seq_first_[s + 1] - rows;
    kernels::RmsNorm(&x_[row * H], final_norm_.data(), &last_[r * H], rows, static_cast<int>(H),
                     c.rms_norm_eps, plus_one);
    r += rows;
  }
  const std::vector<uint16_t>& head16 = c.tie_word_embeddings ? embed_bf16_ : lm_head_bf16_;
  const std::vector<float>& head32 = c.tie_word_embeddings ? embed_ : lm_head_;
  if (!head16.empty()) {
    kernels::LinearBf16(last_.data(), head16.data(), logits.data(), want, c.vocab_size, H,
                        pool_.get());
  } else {
    kernels::Linear(last_.data(), head32.data(), nullptr, logits.data(), want, c.vocab_size, H,
                    pool_.get());
  }
  if (c.final_logit_softcap > 0.f) {
    const float cap = c.final_logit_softcap;
    for (int64_t i = 0; i < want * c.vocab_size; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  return Status::Ok();
}

}  // namespace agentkv::backend::cpu
