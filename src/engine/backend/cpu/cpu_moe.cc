#include "engine/backend/cpu/cpu_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/backend/cpu/cpu_kernels.h"

namespace agentkv::backend::cpu {
namespace kernels {

void RouteTopK(const float* logits, int num_experts, int k, model::MoeRouting routing,
               bool renormalize, int32_t* experts, float* weights) {
  // Softmax first when routing asks for it; selection then runs on `v`.
  float probs[1024];
  const float* v = logits;
  if (routing == model::MoeRouting::kSoftmaxThenTopK) {
    float mx = logits[0];
    for (int e = 1; e < num_experts; ++e) mx = std::max(mx, logits[e]);
    float sum = 0.f;
    for (int e = 0; e < num_experts; ++e) sum += probs[e] = std::exp(logits[e] - mx);
    for (int e = 0; e < num_experts; ++e) probs[e] /= sum;
    v = probs;
  }
  // k passes of argmax over the experts not yet taken; a strict > keeps the
  // lower id on ties.
  uint64_t taken[16] = {};  // num_experts <= 1024
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < num_experts; ++e) {
      if (taken[e / 64] >> (e % 64) & 1) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    taken[best / 64] |= uint64_t{1} << (best % 64);
    experts[j] = best;
    weights[j] = v[best];
  }
  if (routing == model::MoeRouting::kTopKThenSoftmax) {
    const float mx = weights[0];  // the largest, taken first
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += weights[j] = std::exp(weights[j] - mx);
    for (int j = 0; j < k; ++j) weights[j] /= sum;
  } else if (renormalize) {
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += weights[j];
    for (int j = 0; j < k; ++j) weights[j] /= sum;
  }
}

void ClampedSwiglu(const float* gate_up, float* out, int64_t rows, int n, float limit) {
  constexpr float kAlpha = 1.702f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * n;
    const float* u = g + n;
    float* o = out + r * n;
    for (int i = 0; i < n; ++i) {
      const float gate = std::min(g[i], limit);
      const float up = std::clamp(u[i], -limit, limit);
      o[i] = (up + 1.0f) * gate / (1.0f + std::exp(-kAlpha * gate));
    }
  }
}

}  // namespace kernels

namespace {

Result<std::vector<float>> Load(const model::WeightSource& w, const std::string& name,
                                std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> s(shape);
  return w.LoadF32(name, s);
}

}  // namespace

uint64_t MoeLayerWeights::bytes() const {
  uint64_t n = 0;
  for (const auto* v : {&router, &router_bias, &gate_up, &gate_up_bias, &down, &down_bias})
    n += v->size() * sizeof(float);
  n += q_gate_up.bytes() + q_down.bytes();
  for (const auto* qs : {&qe_gate_up, &qe_down})
    for (const QuantMatrix& q : *qs) n += q.bytes();
  return n;
}

namespace {

// One expert's linear weight [out, in] appended to its stacked matrix:
// quantized as stored, or fp32 rows for a part a checkpoint leaves as float.
Status AppendExpertPart(QuantMatrix& q, const model::WeightSource& w,
                        const model::QuantConfig& quant, const std::string& name, int64_t out,
                        int64_t in) {
  const std::vector<int64_t> shape = {out, in};
  if (w.IsQuantized(name)) {
    ASSIGN_OR_RETURN(model::QuantizedWeight qw, w.LoadQuantized(name, shape, quant));
    return q.Append(std::move(qw)).WithContext(name);
  }
  ASSIGN_OR_RETURN(std::vector<float> f, w.LoadF32(name, shape));
  return q.AppendF32(std::move(f), out, in).WithContext(name);
}

Status LoadGptOssExperts(const model::ModelConfig& c, const model::WeightSource& w,
                         const std::string& p, MoeLayerWeights& m) {
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  const std::string gu_name = p + "experts.gate_up_proj", dn_name = p + "experts.down_proj";
  if (w.IsQuantized(gu_name) || w.IsQuantized(dn_name)) {
    // MXFP4 as released: [out, in] order, gate and up rows interleaved
    // (CpuMoe::Forward separates the product's columns).
    ASSIGN_OR_RETURN(m.q_gate_up,
                     w.LoadQuantized(gu_name, std::vector<int64_t>{E, 2 * I, H}, c.quant));
    ASSIGN_OR_RETURN(m.q_down, w.LoadQuantized(dn_name, std::vector<int64_t>{E, H, I}, c.quant));
  } else {
    m.gate_up.resize(E * 2 * I * H);
    m.down.resize(E * H * I);
    ASSIGN_OR_RETURN(std::vector<float> gu, Load(w, gu_name, {E, H, 2 * I}));
    ASSIGN_OR_RETURN(std::vector<float> dn, Load(w, dn_name, {E, I, H}));
    // [in][2I] with gate in the even columns, up in the odd ones -> [2I][in]
    // with gate rows first.
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < I; ++j) {
          const float* src = &gu[(e * H + h) * 2 * I + 2 * j];
          m.gate_up[(e * 2 * I + j) * H + h] = src[0];
          m.gate_up[(e * 2 * I + I + j) * H + h] = src[1];
        }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < I; ++i)
        for (int64_t h = 0; h < H; ++h) m.down[(e * H + h) * I + i] = dn[(e * I + i) * H + h];
  }
  if (c.moe.expert_bias) {
    ASSIGN_OR_RETURN(std::vector<float> gb, Load(w, gu_name + "_bias", {E, 2 * I}));
    m.gate_up_bias.resize(E * 2 * I);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < I; ++j) {
        m.gate_up_bias[e * 2 * I + j] = gb[e * 2 * I + 2 * j];
        m.gate_up_bias[e * 2 * I + I + j] = gb[e * 2 * I + 2 * j + 1];
      }
    ASSIGN_OR_RETURN(m.down_bias, Load(w, dn_name + "_bias", {E, H}));
  }
  return Status::Ok();
}

}  // namespace

Status LoadMoeLayer(const model::ModelConfig& c, const model::WeightSource& w, int layer,
                    MoeLayerWeights* out) {
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  MoeLayerWeights& m = *out;
  m = MoeLayerWeights();
  m.num_experts = static_cast<int>(E);
  m.hidden = static_cast<int>(H);
  m.inter = static_cast<int>(I);
  if (c.arch == model::Architecture::kGptOss) {
    ASSIGN_OR_RETURN(m.router, Load(w, p + "router.weight", {E, H}));
    if (c.moe.router_bias) {
      ASSIGN_OR_RETURN(m.router_bias, Load(w, p + "router.bias", {E}));
    }
    return LoadGptOssExperts(c, w, p, m);
  }
  // The router is never quantized (published FP8 checkpoints leave it).
  ASSIGN_OR_RETURN(m.router, Load(w, p + "gate.weight", {E, H}));
  if (w.Has(p + "experts.gate_up_proj")) {
    // Fused: [E][2I][H] (gate rows then up rows) and [E][H][I], our layout.
    ASSIGN_OR_RETURN(m.gate_up, Load(w, p + "experts.gate_up_proj", {E, 2 * I, H}));
    ASSIGN_OR_RETURN(m.down, Load(w, p + "experts.down_proj", {E, H, I}));
    return Status::Ok();
  }
  auto expert = [&](int64_t e) { return p + "experts." + std::to_string(e) + "."; };
  bool quantized = false;
  for (int64_t e = 0; e < E && !quantized; ++e)
    for (const char* part : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
      quantized = quantized || w.IsQuantized(expert(e) + part);
  if (quantized) {
    m.qe_gate_up.resize(E);
    m.qe_down.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = expert(e);
      RETURN_IF_ERROR(AppendExpertPart(m.qe_gate_up[e], w, c.quant, q + "gate_proj.weight", I, H));
      RETURN_IF_ERROR(AppendExpertPart(m.qe_gate_up[e], w, c.quant, q + "up_proj.weight", I, H));
      RETURN_IF_ERROR(AppendExpertPart(m.qe_down[e], w, c.quant, q + "down_proj.weight", H, I));
    }
    return Status::Ok();
  }
  m.gate_up.resize(E * 2 * I * H);
  m.down.resize(E * H * I);
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = expert(e);
    ASSIGN_OR_RETURN(std::vector<float> g, Load(w, q + "gate_proj.weight", {I, H}));
    ASSIGN_OR_RETURN(std::vector<float> u, Load(w, q + "up_proj.weight", {I, H}));
    ASSIGN_OR_RETURN(std::vector<float> d, Load(w, q + "down_proj.weight", {H, I}));
    std::copy(g.begin(), g.end(), m.gate_up.begin() + e * 2 * I * H);
    std::copy(u.begin(), u.end(), m.gate_up.begin() + (e * 2 + 1) * I * H);
    std::copy(d.begin(), d.end(), m.down.begin() + e * H * I);
  }
  return Status::Ok();
}

void CpuMoe::Forward(const model::ModelConfig& c, const MoeLayerWeights& w, const float* h,
                     float* out, int64_t T, ThreadPool* pool) {
  const int E = w.num_experts, K = c.moe.experts_per_token;
  const int64_t H = w.hidden, I = w.inter;
  logits_.resize(T * E);
  experts_.resize(T * K);
  weights_.resize(T * K);
  kernels::Linear(h, w.router.data(), w.router_bias.empty() ? nullptr : w.router_bias.data(),
                  logits_.data(), T, E, H, pool);
  for (int64_t t = 0; t < T; ++t)
    kernels::RouteTopK(&logits_[t * E], E, K, c.moe.routing, c.moe.norm_topk_prob, &experts_[t * K],
                       &weights_[t * K]);
  // Group the (token, slot) pairs by expert: counting sort, tokens ascending
  // within an expert.
  count_.assign(E, 0);
  for (int64_t i = 0; i < T * K; ++i) ++count_[experts_[i]];
  first_.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) first_[e + 1] = first_[e] + count_[e];
  order_.resize(T * K);
  std::vector<int32_t>& fill = count_;
  std::copy(first_.begin(), first_.end() - 1, fill.begin());
  for (int64_t i = 0; i < T * K; ++i) order_[fill[experts_[i]]++] = static_cast<int32_t>(i);

  int64_t most = 0;
  for (int e = 0; e < E; ++e) most = std::max<int64_t>(most, first_[e + 1] - first_[e]);
  xs_.resize(most * H);
  gu_.resize(most * 2 * I);
  if (w.batched_quant()) raw_.resize(most * 2 * I);
  act_.resize(most * I);
  ys_.resize(most * H);
  std::memset(out, 0, sizeof(float) * T * H);
  for (int e = 0; e < E; ++e) {
    const int64_t n = first_[e + 1] - first_[e];
    if (n == 0) continue;
    const int32_t* pairs = &order_[first_[e]];
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(&xs_[j * H], h + (pairs[j] / K) * H, sizeof(float) * H);
    const float* gu_bias = w.gate_up_bias.empty() ? nullptr : &w.gate_up_bias[e * 2 * I];
    if (w.batched_quant()) {
      // Rows gate 0, up 0, gate 1, ...: the product's columns come out
      // interleaved; separate them into gate | up and add the bias (held in
      // that order).
      QuantLinear(xs_.data(), w.q_gate_up, e, nullptr, raw_.data(), n, pool, qscratch_);
      for (int64_t j = 0; j < n; ++j) {
        const float* r = &raw_[j * 2 * I];
        float* g = &gu_[j * 2 * I];
        for (int64_t i = 0; i < I; ++i) {
          g[i] = r[2 * i];
          g[I + i] = r[2 * i + 1];
        }
        if (gu_bias)
          for (int64_t i = 0; i < 2 * I; ++i) g[i] += gu_bias[i];
      }
    } else if (w.per_expert_quant()) {
      QuantLinear(xs_.data(), w.qe_gate_up[e], gu_bias, gu_.data(), n, pool, qscratch_);
    } else {
      kernels::Linear(xs_.data(), &w.gate_up[e * 2 * I * H], gu_bias, gu_.data(), n, 2 * I, H,
                      pool);
    }
    if (c.moe.swiglu_limit > 0) {
      kernels::ClampedSwiglu(gu_.data(), act_.data(), n, static_cast<int>(I), c.moe.swiglu_limit);
    } else {
      kernels::GatedActivation(gu_.data(), act_.data(), n, static_cast<int>(I), c.activation);
    }
    const float* dn_bias = w.down_bias.empty() ? nullptr : &w.down_bias[e * H];
    if (w.batched_quant()) {
      QuantLinear(act_.data(), w.q_down, e, dn_bias, ys_.data(), n, pool, qscratch_);
    } else if (w.per_expert_quant()) {
      QuantLinear(act_.data(), w.qe_down[e], dn_bias, ys_.data(), n, pool, qscratch_);
    } else {
      kernels::Linear(act_.data(), &w.down[e * H * I], dn_bias, ys_.data(), n, H, I, pool);
    }
    for (int64_t j = 0; j < n; ++j) {
      const float wt = weights_[pairs[j]];
      float* o = out + (pairs[j] / K) * H;
      const float* y = &ys_[j * H];
      for (int64_t d = 0; d < H; ++d) o[d] += wt * y[d];
    }
  }
}

}  // namespace agentkv::backend::cpu
