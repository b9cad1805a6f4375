// CudaBackend's mixture-of-experts layers (GPT-OSS, Qwen3-MoE): loading
// the router and experts into the device layout (bf16, or fp8 block /
// mxfp4 experts kept quantized), and the MLP of such a layer
// (kernels/moe.h's pipeline).
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/backend_layer.h"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/status.h"

namespace agentkv::backend::cuda {
namespace {

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// A tensor's bf16 bits: as stored, or rounded from whatever dtype it has.
Result<std::vector<uint16_t>> LoadBits(const model::WeightSource& w, const std::string& name,
                                       const std::vector<int64_t>& shape) {
  if (auto e = w.LoadBf16IfStored(name, shape); e.ok()) return std::move(e).value();
  ASSIGN_OR_RETURN(std::vector<float> f, w.LoadF32(name, shape));
  std::vector<uint16_t> bits(f.size());
  for (size_t i = 0; i < f.size(); ++i) bits[i] = Bf16Bits(f[i]);
  return bits;
}

Result<std::vector<float>> LoadFloats(const model::WeightSource& w, const std::string& name,
                                      const std::vector<int64_t>& shape) {
  return w.LoadF32(name, shape);
}

// [n][rows][cols] -> [n][cols][rows], in 64 x 64 tiles (a GPT-OSS-20B
// layer's gate_up is 530M elements: element by element, every write missed
// the cache).
std::vector<uint16_t> Transposed(const std::vector<uint16_t>& a, int64_t n, int64_t rows,
                                 int64_t cols) {
  constexpr int64_t kTile = 64;
  std::vector<uint16_t> t(a.size());
  for (int64_t e = 0; e < n; ++e) {
    const uint16_t* src = a.data() + e * rows * cols;
    uint16_t* dst = t.data() + e * rows * cols;
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c0 = 0; c0 < cols; c0 += kTile)
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
          for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
            dst[c * rows + r] = src[r * cols + c];
  }
  return t;
}

// Per expert [gate rows (I) | up rows (I)] of `cols` -> rows interleaved
// (gate j at 2j, up j at 2j + 1), in place of the expert's 2I rows.
void InterleaveInto(const uint16_t* gate, const uint16_t* up, int64_t I, int64_t cols,
                    uint16_t* out) {
  for (int64_t j = 0; j < I; ++j) {
    std::memcpy(out + (2 * j) * cols, gate + j * cols, cols * 2);
    std::memcpy(out + (2 * j + 1) * cols, up + j * cols, cols * 2);
  }
}

// A layer's quantized experts on the host, as the kernels read them
// (cuda::MoeGemmParams): codes [E][N][row bytes], and fp8 block scales or
// mxfp4 exponents.
struct QuantExperts {
  kernels::MoeWeightFormat format = kernels::MoeWeightFormat::kBf16;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<uint8_t> exps;
  int block_rows = 128, block_cols = 128;
  bool scale_pairs = false;
};

// The kernels' format of a stored weight: fp8 with block scales whose
// columns hold whole 16-byte loads, or mxfp4; Unimplemented otherwise.
Result<kernels::MoeWeightFormat> KernelFormat(const model::QuantizedWeight& q,
                                              const std::string& name) {
  if (q.format == model::QuantFormat::kMxfp4) return kernels::MoeWeightFormat::kMxfp4;
  if (q.format == model::QuantFormat::kFp8Block && q.block_cols % 16 == 0)
    return kernels::MoeWeightFormat::kFp8Block;
  return Unimplemented("cuda backend: " + name + " is " +
                       std::string(model::QuantFormatName(q.format)) +
                       (q.format == model::QuantFormat::kFp8Block
                            ? " with blocks of " + std::to_string(q.block_cols) + " columns"
                            : std::string()) +
                       "; the MoE kernels read fp8 with block scales (blocks of whole 16 "
                       "columns) and mxfp4 experts");
}

// Bytes of one row's codes (fp8: a byte a value; mxfp4: two values a byte).
int64_t RowBytes(kernels::MoeWeightFormat f, int64_t cols) {
  return f == kernels::MoeWeightFormat::kMxfp4 ? cols / 2 : cols;
}

// GPT-OSS's experts as released: all experts in one weight, [out, in],
// gate and up rows already interleaved.
Result<QuantExperts> FromBatched(model::QuantizedWeight q, const std::string& name) {
  QuantExperts x;
  ASSIGN_OR_RETURN(x.format, KernelFormat(q, name));
  x.codes = std::move(q.codes);
  x.scales = std::move(q.scales);
  x.exps = std::move(q.exponents);
  x.block_rows = q.block_rows;
  x.block_cols = q.block_cols;
  return x;
}

// Qwen3-MoE's per-expert weights stacked: one part per expert (down), or
// two (gate and up) with their rows interleaved and their scales paired
// (each part keeps its own blocks). Every part of one format and block
// shape; `names(e)` the expert's parts, each rows x cols.
Result<QuantExperts> Stacked(const model::WeightSource& w, const model::QuantConfig& quant,
                             int64_t E,
                             const std::function<std::vector<std::string>(int64_t)>& names,
                             int64_t rows, int64_t cols) {
  QuantExperts x;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<std::string> parts = names(e);
    std::vector<model::QuantizedWeight> q;
    for (const std::string& n : parts) {
      ASSIGN_OR_RETURN(model::QuantizedWeight one,
                       w.LoadQuantized(n, std::vector<int64_t>{rows, cols}, quant));
      ASSIGN_OR_RETURN(const kernels::MoeWeightFormat f, KernelFormat(one, n));
      if (e == 0 && q.empty()) {
        x.format = f;
        x.block_rows = one.block_rows;
        x.block_cols = one.block_cols;
      } else if (f != x.format || one.block_rows != x.block_rows ||
                 one.block_cols != x.block_cols) {
        return Unimplemented("cuda backend: " + n +
                             " is stored unlike the layer's other experts (format or blocks)");
      }
      q.push_back(std::move(one));
    }
    const int64_t rb = RowBytes(x.format, cols), re = cols / model::kMxfp4Block;
    for (int64_t r = 0; r < rows; ++r)
      for (const model::QuantizedWeight& part : q) {
        x.codes.insert(x.codes.end(), part.codes.begin() + r * rb,
                       part.codes.begin() + (r + 1) * rb);
        if (x.format == kernels::MoeWeightFormat::kMxfp4)
          x.exps.insert(x.exps.end(), part.exponents.begin() + r * re,
                        part.exponents.begin() + (r + 1) * re);
      }
    for (const model::QuantizedWeight& part : q)
      x.scales.insert(x.scales.end(), part.scales.begin(), part.scales.end());
    x.scale_pairs = q.size() == 2 && x.format == kernels::MoeWeightFormat::kFp8Block;
  }
  return x;
}

}  // namespace

uint64_t CudaBackend::weight_bytes() const {
  uint64_t n = 0;
  for (const cuda::DeviceBuffer& b : weight_mem_) n += b.bytes();
  return n;
}

Status CudaBackend::UploadHost(const void* data, size_t bytes, void** out) {
  cuda::DeviceBuffer buf;
  RETURN_IF_ERROR(buf.Allocate(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.get(), data, bytes, cudaMemcpyHostToDevice));
  *out = buf.get();
  weight_mem_.push_back(std::move(buf));
  return Status::Ok();
}

Status CudaBackend::LoadMoeLayer(const model::WeightSource& w, int layer, Layer* L) {
  const model::ModelConfig& c = config_;
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  // (Create refused the expert shapes the kernels do not take.)
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  std::vector<uint16_t> router, gate_up, down;
  std::vector<float> router_bias, gate_up_bias, down_bias;
  // Quantized experts stay so (dequantized inside the kernels).
  QuantExperts q_gate_up, q_down;
  const std::string gu_fused = p + "experts.gate_up_proj", dn_fused = p + "experts.down_proj";
  auto expert = [&](int64_t e) { return p + "experts." + std::to_string(e) + "."; };
  bool quantized = false;
  if (c.arch == model::Architecture::kGptOss) {
    quantized = w.IsQuantized(gu_fused) || w.IsQuantized(dn_fused);
  } else if (!w.Has(gu_fused)) {
    int parts = 0;
    for (int64_t e = 0; e < E; ++e)
      for (const char* part : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
        parts += w.IsQuantized(expert(e) + part);
    if (parts != 0 && parts != 3 * E)
      return Unimplemented("cuda backend: layer " + std::to_string(layer) +
                           " has some experts quantized and some not");
    quantized = parts != 0;
  } else if (w.IsQuantized(gu_fused) || w.IsQuantized(dn_fused)) {
    return Unimplemented("cuda backend: " + gu_fused + " is quantized in the fused layout");
  }
  if (!quantized) gate_up.resize(static_cast<size_t>(E * 2 * I * H));
  if (quantized && c.arch == model::Architecture::kGptOss) {
    ASSIGN_OR_RETURN(router, LoadBits(w, p + "router.weight", {E, H}));
    if (c.moe.router_bias) {
      ASSIGN_OR_RETURN(router_bias, LoadFloats(w, p + "router.bias", {E}));
    }
    ASSIGN_OR_RETURN(model::QuantizedWeight gu,
                     w.LoadQuantized(gu_fused, std::vector<int64_t>{E, 2 * I, H}, c.quant));
    ASSIGN_OR_RETURN(q_gate_up, FromBatched(std::move(gu), gu_fused));
    ASSIGN_OR_RETURN(model::QuantizedWeight dn,
                     w.LoadQuantized(dn_fused, std::vector<int64_t>{E, H, I}, c.quant));
    ASSIGN_OR_RETURN(q_down, FromBatched(std::move(dn), dn_fused));
    if (c.moe.expert_bias) {
      ASSIGN_OR_RETURN(gate_up_bias, LoadFloats(w, gu_fused + "_bias", {E, 2 * I}));
      ASSIGN_OR_RETURN(down_bias, LoadFloats(w, dn_fused + "_bias", {E, H}));
    }
  } else if (quantized) {
    ASSIGN_OR_RETURN(router, LoadBits(w, p + "gate.weight", {E, H}));
    ASSIGN_OR_RETURN(q_gate_up, Stacked(
                                    w, c.quant, E,
                                    [&](int64_t e) {
                                      return std::vector<std::string>{
                                          expert(e) + "gate_proj.weight",
                                          expert(e) + "up_proj.weight"};
                                    },
                                    I, H));
    ASSIGN_OR_RETURN(q_down, Stacked(
                                 w, c.quant, E,
                                 [&](int64_t e) {
                                   return std::vector<std::string>{expert(e) + "down_proj.weight"};
                                 },
                                 H, I));
  } else if (c.arch == model::Architecture::kGptOss) {
    ASSIGN_OR_RETURN(router, LoadBits(w, p + "router.weight", {E, H}));
    if (c.moe.router_bias) {
      ASSIGN_OR_RETURN(router_bias, LoadFloats(w, p + "router.bias", {E}));
    }
    // [E][H][2I] with gate in the even columns and up in the odd ones:
    // transposed, the rows come out interleaved as the kernels take them.
    ASSIGN_OR_RETURN(std::vector<uint16_t> gu,
                     LoadBits(w, p + "experts.gate_up_proj", {E, H, 2 * I}));
    gate_up = Transposed(gu, E, H, 2 * I);
    ASSIGN_OR_RETURN(std::vector<uint16_t> dn, LoadBits(w, p + "experts.down_proj", {E, I, H}));
    down = Transposed(dn, E, I, H);
    if (c.moe.expert_bias) {
      // (Already interleaved, as the columns above.)
      ASSIGN_OR_RETURN(gate_up_bias, LoadFloats(w, p + "experts.gate_up_proj_bias", {E, 2 * I}));
      ASSIGN_OR_RETURN(down_bias, LoadFloats(w, p + "experts.down_proj_bias", {E, H}));
    }
  } else {
    ASSIGN_OR_RETURN(router, LoadBits(w, p + "gate.weight", {E, H}));
    if (w.Has(p + "experts.gate_up_proj")) {
      // Fused [E][2I][H] (gate rows, then up rows) and [E][H][I].
      ASSIGN_OR_RETURN(std::vector<uint16_t> gu,
                       LoadBits(w, p + "experts.gate_up_proj", {E, 2 * I, H}));
      for (int64_t e = 0; e < E; ++e)
        InterleaveInto(gu.data() + e * 2 * I * H, gu.data() + (e * 2 + 1) * I * H, I, H,
                       gate_up.data() + e * 2 * I * H);
      ASSIGN_OR_RETURN(down, LoadBits(w, p + "experts.down_proj", {E, H, I}));
    } else {
      down.resize(static_cast<size_t>(E * H * I));
      for (int64_t e = 0; e < E; ++e) {
        const std::string q = p + "experts." + std::to_string(e) + ".";
        ASSIGN_OR_RETURN(std::vector<uint16_t> g, LoadBits(w, q + "gate_proj.weight", {I, H}));
        ASSIGN_OR_RETURN(std::vector<uint16_t> u, LoadBits(w, q + "up_proj.weight", {I, H}));
        ASSIGN_OR_RETURN(std::vector<uint16_t> d, LoadBits(w, q + "down_proj.weight", {H, I}));
        InterleaveInto(g.data(), u.data(), I, H, gate_up.data() + e * 2 * I * H);
        std::memcpy(down.data() + e * H * I, d.data(), d.size() * 2);
      }
    }
  }
  void* ptr = nullptr;
  RETURN_IF_ERROR(UploadHost(router.data(), router.size() * 2, &ptr));
  L->router = static_cast<kernels::bf16_t*>(ptr);
  if (quantized) {
    if (q_gate_up.format != q_down.format ||
        (q_gate_up.format == kernels::MoeWeightFormat::kFp8Block &&
         (q_gate_up.block_rows != q_down.block_rows || q_gate_up.block_cols != q_down.block_cols)))
      return Unimplemented("cuda backend: layer " + std::to_string(layer) +
                           "'s gate_up and down experts are stored in different formats or "
                           "blocks");
    // The kernels read quantized rows in whole 16-byte loads.
    for (auto [n, k] : {std::pair{2 * I, H}, std::pair{H, I}})
      if (kernels::ChooseMoeGemmPath(1, c.moe.experts_per_token, static_cast<int>(E),
                                     static_cast<int>(n), static_cast<int>(k),
                                     q_gate_up.format) == kernels::MoeGemmPath::kUnsupported)
        return Unimplemented("cuda backend: quantized experts of " + std::to_string(n) + " x " +
                             std::to_string(k) + ": the MoE kernels need inputs in whole " +
                             std::to_string(kernels::MoeWeightVecElems(q_gate_up.format)) +
                             "-value loads");
    L->experts_format = q_gate_up.format;
    L->experts_block_rows = q_gate_up.block_rows;
    L->experts_block_cols = q_gate_up.block_cols;
    L->experts_gate_up_scale_pairs = q_gate_up.scale_pairs;
    for (auto [src, codes, scales, exps] :
         {std::tuple{&q_gate_up, &L->experts_gate_up_q, &L->experts_gate_up_scales,
                     &L->experts_gate_up_exps},
          std::tuple{&q_down, &L->experts_down_q, &L->experts_down_scales,
                     &L->experts_down_exps}}) {
      RETURN_IF_ERROR(UploadHost(src->codes.data(), src->codes.size(), &ptr));
      *codes = static_cast<const uint8_t*>(ptr);
      if (!src->scales.empty()) {
        RETURN_IF_ERROR(UploadHost(src->scales.data(), src->scales.size() * 4, &ptr));
        *scales = static_cast<const float*>(ptr);
      }
      if (!src->exps.empty()) {
        RETURN_IF_ERROR(UploadHost(src->exps.data(), src->exps.size(), &ptr));
        *exps = static_cast<const uint8_t*>(ptr);
      }
    }
  } else {
    RETURN_IF_ERROR(UploadHost(gate_up.data(), gate_up.size() * 2, &ptr));
    L->experts_gate_up = static_cast<kernels::bf16_t*>(ptr);
    RETURN_IF_ERROR(UploadHost(down.data(), down.size() * 2, &ptr));
    L->experts_down = static_cast<kernels::bf16_t*>(ptr);
  }
  for (auto [v, out] : {std::pair{&router_bias, &L->router_bias},
                        std::pair{&gate_up_bias, &L->experts_gate_up_bias},
                        std::pair{&down_bias, &L->experts_down_bias}}) {
    if (v->empty()) continue;
    RETURN_IF_ERROR(UploadHost(v->data(), v->size() * 4, &ptr));
    *out = static_cast<float*>(ptr);
  }
  return Status::Ok();
}

Status CudaBackend::MoeMlp(const Layer& L, int T) {
  const model::ModelConfig& c = config_;
  const int E = c.moe.num_experts, K = c.moe.experts_per_token, H = c.hidden_size;
  const int I = c.moe.expert_intermediate, A = T * K;
  if (T <= 0) return Status::Ok();
  // h = RMSNorm(x) (adding the attention's pending split-K planes into x).
  RETURN_IF_ERROR(Norm(nullptr, L.post_attn_norm, T));
  const auto* h = h_.get<kernels::bf16_t>();
  // The router from x in fp32 (the norm again, unrounded).
  CUDA_RETURN_IF_ERROR(kernels::LaunchMoeRouterLogits(
      x_.get<float>(), L.post_attn_norm, c.rms_norm_eps, c.gemma_norm, L.router, L.router_bias, T,
      H, E, moe_logits_.get<float>(), launch_));
  const bool softmax_first = c.moe.routing == model::MoeRouting::kSoftmaxThenTopK;
  int32_t* experts = moe_experts_.get<int32_t>();
  float* weights = moe_weights_.get<float>();
  CUDA_RETURN_IF_ERROR(kernels::LaunchMoeRoute(moe_logits_.get<float>(), T, E, K, softmax_first,
                                               softmax_first && c.moe.norm_topk_prob, experts,
                                               weights, launch_));
  int32_t* offsets = moe_plan_.get<int32_t>();
  int32_t* tiles = offsets + (E + 1);
  int32_t* order = tiles + (E + 1);
  int32_t* slot_of = order + cap_tokens_ * K;
  CUDA_RETURN_IF_ERROR(
      kernels::LaunchMoePlan(experts, A, E, offsets, tiles, order, slot_of, launch_));
  kernels::MoeGemmParams g;
  g.x = h;
  g.order = order;
  g.div = K;
  g.format = L.experts_format;
  g.w = L.experts_gate_up;
  g.wq = L.experts_gate_up_q;
  g.scales = L.experts_gate_up_scales;
  g.scale_pairs = L.experts_gate_up_scale_pairs;
  g.exps = L.experts_gate_up_exps;
  g.block_rows = L.experts_block_rows;
  g.block_cols = L.experts_block_cols;
  g.bias = L.experts_gate_up_bias;
  g.N = 2 * I;
  g.K = H;
  g.offsets = offsets;
  g.tiles = tiles;
  g.num_experts = E;
  g.max_tiles = kernels::MoeMaxTiles(A, E);
  g.epilogue = c.moe.swiglu_limit > 0.f ? kernels::MoeEpilogue::kClampedSwiglu
                                        : kernels::MoeEpilogue::kSwiglu;
  g.limit = c.moe.swiglu_limit;
  g.act = moe_act_.get<kernels::bf16_t>();
  // Each GEMM on the kernel the step's shape calls for (a token takes an
  // expert once: no group has more than T rows).
  g.max_group_rows = T;
  g.path = kernels::ChooseMoeGemmPath(T, K, E, g.N, g.K, g.format, options_.tuning.moe_gemv);
  CUDA_RETURN_IF_ERROR(kernels::LaunchMoeGemm(g, launch_));
  kernels::MoeGemmParams d = g;
  d.x = g.act;
  d.order = nullptr;
  d.div = 1;
  d.w = L.experts_down;
  d.wq = L.experts_down_q;
  d.scales = L.experts_down_scales;
  d.scale_pairs = false;
  d.exps = L.experts_down_exps;
  d.bias = L.experts_down_bias;
  d.N = H;
  d.K = I;
  d.epilogue = kernels::MoeEpilogue::kStore;
  d.act = nullptr;
  d.y = moe_y_.get<float>();
  d.path = kernels::ChooseMoeGemmPath(T, K, E, d.N, d.K, d.format, options_.tuning.moe_gemv);
  CUDA_RETURN_IF_ERROR(kernels::LaunchMoeGemm(d, launch_));
  // Tensor parallelism: each rank's experts hold a slice of every expert's
  // columns, so its weighted sum is a partial one; rank 0 adds it to the
  // residual, the others to zero (the router above read the residual).
  if (tp() && options_.tp_comm.rank() != 0)
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x_.get(), 0, static_cast<size_t>(T) * H * 4, stream_));
  CUDA_RETURN_IF_ERROR(
      kernels::LaunchMoeCombine(d.y, slot_of, weights, T, K, H, x_.get<float>(), launch_));
  if (tp()) RETURN_IF_ERROR(TpReduce(x_.get<float>(), T));
  return Status::Ok();
}

}  // namespace agentkv::backend::cuda
