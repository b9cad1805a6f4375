// CudaBackend's mixture-of-experts layers (GPT-OSS, Qwen3-MoE): loading
// the router and experts into the device layout, and the MLP of such a
// layer (kernels/moe.h's pipeline).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/backend_layer.h"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/status.h"

namespace agentkv {
namespace {

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// A tensor's bf16 bits: as stored, or rounded from whatever dtype it has.
Result<std::vector<uint16_t>> LoadBits(const WeightSource& w, const std::string& name,
                                       const std::vector<int64_t>& shape) {
  if (auto e = w.LoadBf16IfStored(name, shape); e.ok()) return std::move(e).value();
  ASSIGN_OR_RETURN(std::vector<float> f, w.LoadF32(name, shape));
  std::vector<uint16_t> bits(f.size());
  for (size_t i = 0; i < f.size(); ++i) bits[i] = Bf16Bits(f[i]);
  return bits;
}

Result<std::vector<float>> LoadFloats(const WeightSource& w, const std::string& name,
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

}  // namespace

Status CudaBackend::UploadHost(const void* data, size_t bytes, void** out) {
  cuda::DeviceBuffer buf;
  RETURN_IF_ERROR(buf.Allocate(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.get(), data, bytes, cudaMemcpyHostToDevice));
  *out = buf.get();
  weight_mem_.push_back(std::move(buf));
  return Status::Ok();
}

Status CudaBackend::LoadMoeLayer(const WeightSource& w, int layer, Layer* L) {
  const ModelConfig& c = config_;
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  // (Create refused the expert shapes the kernels do not take.)
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  std::vector<uint16_t> router, gate_up(static_cast<size_t>(E * 2 * I * H)), down;
  std::vector<float> router_bias, gate_up_bias, down_bias;
  if (c.arch == Architecture::kGptOss) {
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
  L->router = static_cast<cuda::bf16_t*>(ptr);
  RETURN_IF_ERROR(UploadHost(gate_up.data(), gate_up.size() * 2, &ptr));
  L->experts_gate_up = static_cast<cuda::bf16_t*>(ptr);
  RETURN_IF_ERROR(UploadHost(down.data(), down.size() * 2, &ptr));
  L->experts_down = static_cast<cuda::bf16_t*>(ptr);
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
  const ModelConfig& c = config_;
  const int E = c.moe.num_experts, K = c.moe.experts_per_token, H = c.hidden_size;
  const int I = c.moe.expert_intermediate, A = T * K;
  if (T <= 0) return Status::Ok();
  // h = RMSNorm(x) (adding the attention's pending split-K planes into x).
  RETURN_IF_ERROR(Norm(nullptr, L.post_attn_norm, T));
  const auto* h = h_.get<cuda::bf16_t>();
  // The router from x in fp32 (the norm again, unrounded).
  CUDA_RETURN_IF_ERROR(cuda::LaunchMoeRouterLogits(
      x_.get<float>(), L.post_attn_norm, c.rms_norm_eps, c.gemma_norm, L.router, L.router_bias, T,
      H, E, moe_logits_.get<float>(), launch_));
  const bool softmax_first = c.moe.routing == MoeRouting::kSoftmaxThenTopK;
  int32_t* experts = moe_experts_.get<int32_t>();
  float* weights = moe_weights_.get<float>();
  CUDA_RETURN_IF_ERROR(cuda::LaunchMoeRoute(moe_logits_.get<float>(), T, E, K, softmax_first,
                                            softmax_first && c.moe.norm_topk_prob, experts, weights,
                                            launch_));
  int32_t* offsets = moe_plan_.get<int32_t>();
  int32_t* tiles = offsets + (E + 1);
  int32_t* order = tiles + (E + 1);
  int32_t* slot_of = order + cap_tokens_ * K;
  CUDA_RETURN_IF_ERROR(cuda::LaunchMoePlan(experts, A, E, offsets, tiles, order, slot_of, launch_));
  cuda::MoeGemmParams g;
  g.x = h;
  g.order = order;
  g.div = K;
  g.w = L.experts_gate_up;
  g.bias = L.experts_gate_up_bias;
  g.N = 2 * I;
  g.K = H;
  g.offsets = offsets;
  g.tiles = tiles;
  g.num_experts = E;
  g.max_tiles = cuda::MoeMaxTiles(A, E);
  g.epilogue =
      c.moe.swiglu_limit > 0.f ? cuda::MoeEpilogue::kClampedSwiglu : cuda::MoeEpilogue::kSwiglu;
  g.limit = c.moe.swiglu_limit;
  g.act = moe_act_.get<cuda::bf16_t>();
  // Each GEMM on the kernel the step's shape calls for (a token takes an
  // expert once: no group has more than T rows).
  g.max_group_rows = T;
  g.path = cuda::ChooseMoeGemmPath(T, K, E, g.N, g.K, g.format);
  CUDA_RETURN_IF_ERROR(cuda::LaunchMoeGemm(g, launch_));
  cuda::MoeGemmParams d = g;
  d.x = g.act;
  d.order = nullptr;
  d.div = 1;
  d.w = L.experts_down;
  d.bias = L.experts_down_bias;
  d.N = H;
  d.K = I;
  d.epilogue = cuda::MoeEpilogue::kStore;
  d.act = nullptr;
  d.y = moe_y_.get<float>();
  d.path = cuda::ChooseMoeGemmPath(T, K, E, d.N, d.K, d.format);
  CUDA_RETURN_IF_ERROR(cuda::LaunchMoeGemm(d, launch_));
  CUDA_RETURN_IF_ERROR(
      cuda::LaunchMoeCombine(d.y, slot_of, weights, T, K, H, x_.get<float>(), launch_));
  return Status::Ok();
}

}  // namespace agentkv
