// TpPlan: the split's validation, and its correctness by computation on the
// CPU: one decoder layer of a small random model of every architecture,
// run with the full weights and with each rank's cut of them (partial sums
// added as an all-reduce adds them), gives the same output; the vocabulary
// split's embedding, argmax and log-sum-exp combine to the full ones; KV
// blocks move between the single-GPU layout and the ranks' without loss.
#include "engine/backend/tp_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "../test_model.h"
#include "engine/backend/tp_combine.h"
#include "engine/backend/tp_weight_source.h"
#include "engine/model/quant_pack.h"
#include "engine/model/weight_spec.h"

namespace agentkv::backend {
namespace {

using testing::MapWeights;
using testing::RandomWeights;
using testing::SmallConfig;
using Vec = std::vector<float>;

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// SmallConfig with sizes that split over 2 and 4 ranks into slices of a
// multiple of kTpAlign.
model::ModelConfig TpConfig(model::Architecture arch) {
  model::ModelConfig c = SmallConfig(arch);
  c.intermediate_size = 64;
  if (c.IsMoe()) c.moe.expert_intermediate = 32;
  return c;
}

const model::Architecture kArchs[] = {model::Architecture::kLlama,   model::Architecture::kQwen2,
                                      model::Architecture::kQwen3,   model::Architecture::kMistral,
                                      model::Architecture::kGemma3,  model::Architecture::kGptOss,
                                      model::Architecture::kQwen3Moe};

Vec Load(const model::WeightSource& w, const std::string& name, std::vector<int64_t> shape) {
  auto r = w.LoadF32(name, shape);
  EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
  return r.ok() ? std::move(r).value() : Vec();
}

// y[n] = sum_k x[k] w[n][k] (+ b[n]).
Vec MatVec(const Vec& w, const Vec& x, int64_t n, int64_t k, const Vec* b = nullptr) {
  Vec y(n);
  for (int64_t i = 0; i < n; ++i) {
    double s = b ? (*b)[i] : 0.0;
    for (int64_t j = 0; j < k; ++j) s += static_cast<double>(w[i * k + j]) * x[j];
    y[i] = static_cast<float>(s);
  }
  return y;
}

Vec RmsNorm(const Vec& x, const Vec& w, const model::ModelConfig& c) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const float inv = 1.f / std::sqrt(static_cast<float>(ss / x.size()) + c.rms_norm_eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (c.gemma_norm ? 1.f + w[i] : w[i]);
  return y;
}

float Act(float g, const model::ModelConfig& c) {
  if (c.activation == model::Activation::kGeluTanh)
    return 0.5f * g * (1.f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
  return g / (1.f + std::exp(-g));
}

// The attention block's output o for T tokens (causal, positions 0..T-1;
// the rotary is per head and so left out) with `c`'s heads and `w`'s
// weights: the full o, or for a rank its partial sum.
std::vector<Vec> Attention(const model::ModelConfig& c, const model::WeightSource& w, int layer,
                           const std::vector<Vec>& h) {
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const int64_t H = c.hidden_size, D = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const Vec wq = Load(w, p + "q_proj.weight", {nh * D, H});
  const Vec wk = Load(w, p + "k_proj.weight", {nkv * D, H});
  const Vec wv = Load(w, p + "v_proj.weight", {nkv * D, H});
  const Vec wo = Load(w, p + "o_proj.weight", {H, nh * D});
  Vec bq, bk, bv, bo, sinks, qn, kn;
  if (c.attention_bias) {
    bq = Load(w, p + "q_proj.bias", {nh * D});
    bk = Load(w, p + "k_proj.bias", {nkv * D});
    bv = Load(w, p + "v_proj.bias", {nkv * D});
  }
  if (c.o_proj_bias) bo = Load(w, p + "o_proj.bias", {H});
  if (c.attention_sinks) sinks = Load(w, p + "sinks", {nh});
  if (c.qk_norm) {
    qn = Load(w, p + "q_norm.weight", {D});
    kn = Load(w, p + "k_norm.weight", {D});
  }
  const size_t T = h.size();
  std::vector<Vec> q(T), k(T), v(T), out(T);
  auto head_norm = [&](Vec& x, int64_t heads, const Vec& nw) {
    if (nw.empty()) return;
    for (int64_t j = 0; j < heads; ++j) {
      Vec s(x.begin() + j * D, x.begin() + (j + 1) * D);
      s = RmsNorm(s, nw, c);
      std::copy(s.begin(), s.end(), x.begin() + j * D);
    }
  };
  for (size_t t = 0; t < T; ++t) {
    q[t] = MatVec(wq, h[t], nh * D, H, bq.empty() ? nullptr : &bq);
    k[t] = MatVec(wk, h[t], nkv * D, H, bk.empty() ? nullptr : &bk);
    v[t] = MatVec(wv, h[t], nkv * D, H, bv.empty() ? nullptr : &bv);
    head_norm(q[t], nh, qn);
    head_norm(k[t], nkv, kn);
  }
  const int64_t group = nh / nkv;
  for (size_t t = 0; t < T; ++t) {
    Vec a(nh * D, 0.f);
    for (int64_t j = 0; j < nh; ++j) {
      const int64_t kvh = j / group;
      std::vector<double> s(t + 1);
      double m = sinks.empty() ? -1e30 : sinks[j];
      for (size_t u = 0; u <= t; ++u) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[t][j * D + d] * k[u][kvh * D + d];
        s[u] = dot * c.AttentionScale();
        m = std::max(m, s[u]);
      }
      double z = sinks.empty() ? 0.0 : std::exp(sinks[j] - m);
      for (double& x : s) z += (x = std::exp(x - m));
      for (size_t u = 0; u <= t; ++u)
        for (int64_t d = 0; d < D; ++d)
          a[j * D + d] += static_cast<float>(s[u] / z * v[u][kvh * D + d]);
    }
    out[t] = MatVec(wo, a, H, nh * D, bo.empty() ? nullptr : &bo);
  }
  return out;
}

// The MLP's output for one token (normed input h, residual x for the
// router): the full output, or a rank's partial sum.
Vec Mlp(const model::ModelConfig& c, const model::WeightSource& w, int layer, const Vec& h) {
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  const int64_t H = c.hidden_size;
  if (!c.IsMoeLayer(layer)) {
    const int64_t I = c.intermediate_size;
    const Vec g = MatVec(Load(w, p + "gate_proj.weight", {I, H}), h, I, H);
    const Vec u = MatVec(Load(w, p + "up_proj.weight", {I, H}), h, I, H);
    Vec a(I);
    for (int64_t i = 0; i < I; ++i) a[i] = Act(g[i], c) * u[i];
    return MatVec(Load(w, p + "down_proj.weight", {H, I}), a, H, I);
  }
  const int64_t E = c.moe.num_experts, K = c.moe.experts_per_token, I = c.moe.expert_intermediate;
  const bool oss = c.arch == model::Architecture::kGptOss;
  Vec rb;
  if (c.moe.router_bias) rb = Load(w, p + "router.bias", {E});
  const Vec logits = MatVec(Load(w, p + (oss ? "router.weight" : "gate.weight"), {E, H}), h, E, H,
                            rb.empty() ? nullptr : &rb);
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  // Weights of the top K: softmax over them (GPT-OSS), or over all then
  // renormalised (Qwen3-MoE with norm_topk_prob).
  Vec wt(K);
  double z = 0;
  const double top = logits[order[0]];
  const int64_t over = c.moe.routing == model::MoeRouting::kTopKThenSoftmax ? K : E;
  for (int64_t i = 0; i < over; ++i) z += std::exp(logits[order[i]] - top);
  for (int64_t i = 0; i < K; ++i) wt[i] = static_cast<float>(std::exp(logits[order[i]] - top) / z);
  if (c.moe.norm_topk_prob) {
    const float s = std::accumulate(wt.begin(), wt.end(), 0.f);
    for (float& x : wt) x /= s;
  }
  Vec y(H, 0.f);
  Vec gu, gub, down, downb;
  if (oss) {
    gu = Load(w, p + "experts.gate_up_proj", {E, H, 2 * I});
    gub = Load(w, p + "experts.gate_up_proj_bias", {E, 2 * I});
    down = Load(w, p + "experts.down_proj", {E, I, H});
    downb = Load(w, p + "experts.down_proj_bias", {E, H});
  }
  for (int64_t s = 0; s < K; ++s) {
    const int e = order[s];
    Vec a(I);
    if (oss) {
      const float lim = c.moe.swiglu_limit;
      for (int64_t i = 0; i < I; ++i) {
        double g = gub[e * 2 * I + 2 * i], u = gub[e * 2 * I + 2 * i + 1];
        for (int64_t j = 0; j < H; ++j) {
          g += h[j] * gu[(e * H + j) * 2 * I + 2 * i];
          u += h[j] * gu[(e * H + j) * 2 * I + 2 * i + 1];
        }
        const float gc = std::min(static_cast<float>(g), lim);
        const float uc = std::clamp(static_cast<float>(u), -lim, lim);
        a[i] = (uc + 1.f) * gc / (1.f + std::exp(-1.702f * gc));
      }
      for (int64_t j = 0; j < H; ++j) {
        double o = downb[e * H + j];
        for (int64_t i = 0; i < I; ++i) o += a[i] * down[(e * I + i) * H + j];
        y[j] += wt[s] * static_cast<float>(o);
      }
      continue;
    }
    const std::string q = p + "experts." + std::to_string(e) + ".";
    const Vec g = MatVec(Load(w, q + "gate_proj.weight", {I, H}), h, I, H);
    const Vec u = MatVec(Load(w, q + "up_proj.weight", {I, H}), h, I, H);
    for (int64_t i = 0; i < I; ++i) a[i] = Act(g[i], c) * u[i];
    const Vec o = MatVec(Load(w, q + "down_proj.weight", {H, I}), a, H, I);
    for (int64_t j = 0; j < H; ++j) y[j] += wt[s] * o[j];
  }
  return y;
}

void Add(Vec& a, const Vec& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
}

// One decoder layer over x (T tokens). `parts`: the rank configs and
// weights whose outputs are summed after o_proj and after the MLP, as the
// all-reduces do; the norms and residual adds run once on the sums.
std::vector<Vec> Layer(
    const model::ModelConfig& full, int layer, std::vector<Vec> x,
    const std::vector<std::pair<model::ModelConfig, const model::WeightSource*>>& parts) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const model::WeightSource& w0 = *parts[0].second;  // replicated tensors: any rank's
  const int64_t H = full.hidden_size;
  const Vec in_norm = Load(w0, p + "input_layernorm.weight", {H});
  const Vec post = Load(w0, p + "post_attention_layernorm.weight", {H});
  Vec pre_ff, post_ff;
  if (full.sandwich_norm) {
    pre_ff = Load(w0, p + "pre_feedforward_layernorm.weight", {H});
    post_ff = Load(w0, p + "post_feedforward_layernorm.weight", {H});
  }
  std::vector<Vec> h(x.size());
  for (size_t t = 0; t < x.size(); ++t) h[t] = RmsNorm(x[t], in_norm, full);
  std::vector<Vec> o(x.size(), Vec(H, 0.f));
  for (const auto& [c, w] : parts) {
    const std::vector<Vec> part = Attention(c, *w, layer, h);
    for (size_t t = 0; t < x.size(); ++t) Add(o[t], part[t]);
  }
  for (size_t t = 0; t < x.size(); ++t) {
    Add(x[t], full.sandwich_norm ? RmsNorm(o[t], post, full) : o[t]);
    const Vec h2 = RmsNorm(x[t], full.sandwich_norm ? pre_ff : post, full);
    Vec m(H, 0.f);
    for (const auto& [c, w] : parts) Add(m, Mlp(c, *w, layer, h2));
    Add(x[t], full.sandwich_norm ? RmsNorm(m, post_ff, full) : m);
  }
  return x;
}

std::vector<Vec> RandomRows(int rows, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<Vec> x(rows, Vec(n));
  for (Vec& r : x)
    for (float& v : r) v = nd(rng);
  return x;
}

// Max |a - b| over every element.
float MaxDiff(const std::vector<Vec>& a, const std::vector<Vec>& b) {
  float d = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) d = std::max(d, std::fabs(a[t][i] - b[t][i]));
  return d;
}

TEST(TpPlanTest, ShardedLayerEqualsFullLayerForEveryArchitecture) {
  for (model::Architecture arch : kArchs) {
    const model::ModelConfig c = TpConfig(arch);
    const MapWeights w = RandomWeights(c, 7);
    const std::vector<Vec> x = RandomRows(5, c.hidden_size, 11);
    for (int degree : {2, 4}) {
      auto plan = TpPlan::Make(c, degree, degree);
      ASSERT_TRUE(plan.ok()) << c.model_type << " " << degree << ": " << plan.status().ToString();
      std::vector<TpWeightSource> shards;
      for (int r = 0; r < degree; ++r) shards.emplace_back(w, c, *plan, r);
      std::vector<std::pair<model::ModelConfig, const model::WeightSource*>> parts;
      for (int r = 0; r < degree; ++r) parts.emplace_back(plan->RankConfig(c, r), &shards[r]);
      // Every layer: Qwen3-MoE's layer 1 is dense, Gemma's and GPT-OSS's
      // alternate sliding and full (the window is wider than 5 tokens).
      for (int layer = 0; layer < c.num_layers; ++layer) {
        const std::vector<Vec> want = Layer(c, layer, x, {{c, &w}});
        const std::vector<Vec> got = Layer(c, layer, x, parts);
        EXPECT_LT(MaxDiff(want, got), 2e-4f)
            << "arch " << static_cast<int>(arch) << " degree " << degree << " layer " << layer;
        // A wrong cut (rank 0's shards twice) is caught.
        std::vector<std::pair<model::ModelConfig, const model::WeightSource*>> wrong(degree,
                                                                                     parts[0]);
        EXPECT_GT(MaxDiff(want, Layer(c, layer, x, wrong)), 1e-2f);
      }
    }
  }
}

bool EndsWith(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// `floats` stored as a quantized checkpoint of `config` stores them,
// packed by the synthesizer's packers: GPT-OSS's fused experts as MXFP4
// ([E, out, in], as `name`_blocks / _scales), every other model's linear
// projections (attention, dense MLP, experts) in config.quant's fp8
// format; the rest as floats.
class QuantWeights : public model::WeightSource {
 public:
  QuantWeights(const MapWeights& floats, const model::ModelConfig& config)
      : f_(floats), c_(config) {}
  bool Has(const std::string& name) const override { return f_.Has(name); }
  bool IsQuantized(const std::string& name) const override {
    if (c_.arch == model::Architecture::kGptOss)
      return EndsWith(name, "experts.gate_up_proj") || EndsWith(name, "experts.down_proj");
    for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                          "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
      if (EndsWith(name, s)) return true;
    return false;
  }
  Result<std::vector<float>> LoadF32(const std::string& name,
                                     std::span<const int64_t> shape) const override {
    if (IsQuantized(name)) return InvalidArgument(name + " is stored quantized");
    return f_.LoadF32(name, shape);
  }
  Result<model::QuantizedWeight> LoadQuantized(const std::string& name,
                                               std::span<const int64_t> shape,
                                               const model::QuantConfig& quant) const override {
    if (!IsQuantized(name)) return InvalidArgument(name + " is not quantized");
    model::QuantizedWeight w;
    w.shape.assign(shape.begin(), shape.end());
    w.rows = shape[shape.size() - 2];
    w.cols = shape.back();
    w.batch = shape.size() == 3 ? shape[0] : 1;
    const int64_t n = w.rows * w.cols;
    Vec v = f_.t.at(name);
    if (static_cast<int64_t>(v.size()) != w.batch * n) return InvalidArgument(name + ": shape");
    if (c_.arch == model::Architecture::kGptOss) {  // [E, in, out] floats
      Vec t(v.size());
      for (int64_t b = 0; b < w.batch; ++b)
        for (int64_t k = 0; k < w.cols; ++k)
          for (int64_t r = 0; r < w.rows; ++r)
            t[(b * w.rows + r) * w.cols + k] = v[(b * w.cols + k) * w.rows + r];
      v = std::move(t);
    }
    w.format = c_.arch == model::Architecture::kGptOss ? model::QuantFormat::kMxfp4 : quant.format;
    w.codes.resize(static_cast<size_t>(w.format == model::QuantFormat::kMxfp4 ? w.batch * n / 2
                                                                              : w.batch * n));
    for (int64_t b = 0; b < w.batch; ++b) {
      const float* m = v.data() + b * n;
      if (w.format == model::QuantFormat::kMxfp4) {
        w.exponents.resize(static_cast<size_t>(w.batch * n / model::kMxfp4Block));
        model::PackMxfp4(m, w.rows, w.cols, w.codes.data() + b * n / 2,
                         w.exponents.data() + b * n / model::kMxfp4Block);
      } else if (w.format == model::QuantFormat::kFp8Block) {
        w.block_rows = quant.block_rows;
        w.block_cols = quant.block_cols;
        const int64_t g = ((w.rows + w.block_rows - 1) / w.block_rows) *
                          ((w.cols + w.block_cols - 1) / w.block_cols);
        w.scales.resize(static_cast<size_t>(w.batch * g));
        model::PackFp8Block(m, w.rows, w.cols, w.block_rows, w.block_cols, w.codes.data() + b * n,
                            w.scales.data() + b * g);
      } else {
        w.scales.resize(static_cast<size_t>(w.batch * w.rows));
        model::PackFp8Channel(m, w.rows, w.cols, w.codes.data() + b * n,
                              w.scales.data() + b * w.rows);
      }
    }
    RETURN_IF_ERROR(w.Validate());
    return w;
  }

 private:
  const MapWeights& f_;
  model::ModelConfig c_;
};

// A source's quantized weights served dequantized (LoadQuantized, then
// the CPU's DequantizeRows; GPT-OSS's experts transposed back to their
// float layout), so that the layer above runs on what a rank holds.
class Dequantizing : public model::WeightSource {
 public:
  Dequantizing(const model::WeightSource& base, const model::ModelConfig& config)
      : b_(base), c_(config) {}
  bool Has(const std::string& name) const override { return b_.Has(name); }
  Result<std::vector<float>> LoadF32(const std::string& name,
                                     std::span<const int64_t> shape) const override {
    if (!b_.IsQuantized(name)) return b_.LoadF32(name, shape);
    std::vector<int64_t> logical(shape.begin(), shape.end());
    const bool oss = c_.arch == model::Architecture::kGptOss;
    if (oss) std::swap(logical[1], logical[2]);
    ASSIGN_OR_RETURN(model::QuantizedWeight q, b_.LoadQuantized(name, logical, c_.quant));
    Vec out(static_cast<size_t>(q.batch * q.rows * q.cols));
    for (int64_t b = 0; b < q.batch; ++b)
      model::DequantizeRows(q, b, 0, q.rows, out.data() + b * q.rows * q.cols);
    if (!oss) return out;
    Vec t(out.size());
    for (int64_t b = 0; b < q.batch; ++b)
      for (int64_t r = 0; r < q.rows; ++r)
        for (int64_t k = 0; k < q.cols; ++k)
          t[(b * q.cols + k) * q.rows + r] = out[(b * q.rows + r) * q.cols + k];
    return t;
  }

 private:
  const model::WeightSource& b_;
  model::ModelConfig c_;
};

// Quantized checkpoints: each rank's cut of the codes and scales
// (TpWeightSource::LoadQuantized) dequantizes to its slice of the full
// weights, so the sharded layer equals the full dequantized one: fp8 block
// scales on and off the rank boundaries (128 x 128 tiles larger than every
// tensor; 24 x 32 tiles, ragged, cut inside a tile), per-channel fp8, and
// GPT-OSS's MXFP4 experts.
TEST(TpPlanTest, ShardedQuantizedLayerEqualsFullDequantizedLayer) {
  struct Case {
    model::Architecture arch;
    model::QuantMethod method;
    model::QuantFormat format;
    int br, bc;
  };
  const Case cases[] = {
      {model::Architecture::kQwen3, model::QuantMethod::kFp8, model::QuantFormat::kFp8Block, 128,
       128},
      {model::Architecture::kQwen3, model::QuantMethod::kFp8, model::QuantFormat::kFp8Block, 24,
       32},
      {model::Architecture::kLlama, model::QuantMethod::kCompressedTensors,
       model::QuantFormat::kFp8Channel, 0, 0},
      {model::Architecture::kQwen3Moe, model::QuantMethod::kFp8, model::QuantFormat::kFp8Block, 24,
       32},
      {model::Architecture::kGemma3, model::QuantMethod::kFp8, model::QuantFormat::kFp8Block, 16,
       16},
      {model::Architecture::kGptOss, model::QuantMethod::kMxfp4, model::QuantFormat::kMxfp4, 0, 0},
      // MXFP4 slices off the blocks (96: 48 a rank at 2, 24 at 4): padded.
      {model::Architecture::kGptOss, model::QuantMethod::kMxfp4, model::QuantFormat::kMxfp4, 0, 96},
  };
  for (const Case& k : cases) {
    model::ModelConfig c = TpConfig(k.arch);
    if (k.arch == model::Architecture::kGptOss) {
      c.hidden_size = 64;  // whole MXFP4 blocks of gate_up's input
      // 64 and 32 a rank: whole blocks of down's input; or (bc) not.
      c.moe.expert_intermediate = k.bc > 0 ? k.bc : 128;
    }
    if (c.IsMoe() && k.arch != model::Architecture::kGptOss) c.moe.expert_intermediate = 64;
    const MapWeights floats = RandomWeights(c, 23);
    c.quant.method = k.method;
    c.quant.format = k.format;
    if (k.format == model::QuantFormat::kFp8Block) {
      c.quant.block_rows = k.br;
      c.quant.block_cols = k.bc;
    }
    const QuantWeights stored(floats, c);
    const Dequantizing full(stored, c);
    const std::vector<Vec> x = RandomRows(3, c.hidden_size, 5);
    const std::string name = c.model_type + " " + std::string(model::QuantFormatName(k.format)) +
                             " " + std::to_string(k.br) + "x" + std::to_string(k.bc);
    for (int degree : {2, 4}) {
      auto plan = TpPlan::Make(c, degree, degree);
      ASSERT_TRUE(plan.ok()) << name << " " << degree << ": " << plan.status().ToString();
      std::vector<TpWeightSource> cut;
      for (int r = 0; r < degree; ++r) cut.emplace_back(stored, c, *plan, r);
      std::vector<Dequantizing> shards;
      for (int r = 0; r < degree; ++r) shards.emplace_back(cut[r], plan->RankConfig(c, r));
      std::vector<std::pair<model::ModelConfig, const model::WeightSource*>> parts;
      for (int r = 0; r < degree; ++r) parts.emplace_back(plan->RankConfig(c, r), &shards[r]);
      for (int layer = 0; layer < c.num_layers; ++layer) {
        const std::vector<Vec> want = Layer(c, layer, x, {{c, &full}});
        EXPECT_LT(MaxDiff(want, Layer(c, layer, x, parts)), 2e-4f)
            << name << " degree " << degree << " layer " << layer;
      }
      // The rank asks for its logical shape only.
      const std::string q = "model.layers.0.self_attn.q_proj.weight";
      if (stored.IsQuantized(q)) {
        auto bad =
            cut[1].LoadQuantized(q, std::vector<int64_t>{c.num_heads * c.head_dim, 48}, c.quant);
        EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << name;
      }
    }
  }
}

// A quantized weight's cut is CutOf's in its logical [.., out, in] shape:
// the same for every weight stored as [out, in], transposed for GPT-OSS's
// fused experts (floats [E, in, out]).
TEST(TpPlanTest, QuantCutsAreCutOfInTheLogicalShape) {
  const model::ModelConfig oss = TpConfig(model::Architecture::kGptOss);
  auto plan = TpPlan::Make(oss, 2, -1);
  ASSERT_TRUE(plan.ok());
  const TpRange e = plan->ranks[1].expert_intermediate;
  const std::string p = "model.layers.0.mlp.experts.";
  EXPECT_EQ(plan->CutOf(oss, p + "gate_up_proj", 1),
            (TensorCut{TensorCut::Kind::kSlice, 2, 2 * e.begin, 2 * e.size, 1}));
  EXPECT_EQ(plan->QuantCutOf(oss, p + "gate_up_proj", 1),
            (TensorCut{TensorCut::Kind::kSlice, 1, 2 * e.begin, 2 * e.size, 1}));
  EXPECT_EQ(plan->QuantCutOf(oss, p + "down_proj", 1),
            (TensorCut{TensorCut::Kind::kSlice, 2, e.begin, e.size, 1}));
  const model::ModelConfig q = TpConfig(model::Architecture::kQwen3Moe);
  auto qp = TpPlan::Make(q, 4, -1);
  ASSERT_TRUE(qp.ok());
  for (const model::WeightSpec& s : model::ExpectedWeights(q))
    for (int r = 0; r < 4; ++r) EXPECT_EQ(qp->QuantCutOf(q, s.name, r), qp->CutOf(q, s.name, r));
  for (const auto& [name, shape] : TpFusedExpertShapes(q))
    EXPECT_EQ(qp->QuantCutOf(q, name, 3), qp->CutOf(q, name, 3)) << name;
}

// MXFP4 experts whose slices would cut a 32-value block: every rank holds
// the whole blocks around its slice, as many on every rank, zero-padded
// past the last column, and zeroes the columns it does not own in its down
// projection (GPT-OSS's 2,880 at 4: 720 a rank, 23 blocks held).
TEST(TpPlanTest, Mxfp4SlicesOffTheBlocksHoldWholeBlocks) {
  model::ModelConfig c = TpConfig(model::Architecture::kGptOss);
  c.quant.method = model::QuantMethod::kMxfp4;
  c.quant.format = model::QuantFormat::kMxfp4;
  c.moe.expert_intermediate = 2880;
  auto plan = TpPlan::Make(c, 4, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const int64_t begins[] = {0, 704, 1440, 2144};
  for (int r = 0; r < 4; ++r) {
    const TpRank& k = plan->ranks[r];
    EXPECT_EQ(k.expert_intermediate, (TpRange{720 * r, 720}));
    EXPECT_EQ(k.expert_held, (TpRange{begins[r], 736})) << r;
    EXPECT_EQ(plan->RankConfig(c, r).moe.expert_intermediate, 736);
    const TensorCut down = plan->QuantCutOf(c, "model.layers.0.mlp.experts.down_proj", r);
    EXPECT_EQ(down.dim, 2);
    EXPECT_EQ(down.begin, begins[r]);
    EXPECT_EQ(down.size, 736);
    EXPECT_EQ(down.keep_begin, 720 * r);
    EXPECT_EQ(down.keep_end, 720 * (r + 1));
    const TensorCut gu = plan->QuantCutOf(c, "model.layers.0.mlp.experts.gate_up_proj", r);
    EXPECT_EQ(gu, (TensorCut{TensorCut::Kind::kSlice, 1, 2 * begins[r], 2 * 736, 1}));
  }
  // Whole blocks a rank (1,440 at 2): no padding, no zeroed columns.
  auto two = TpPlan::Make(c, 2, -1);
  ASSERT_TRUE(two.ok());
  for (const TpRank& k : two->ranks) EXPECT_EQ(k.expert_held, k.expert_intermediate);
  // 96 at 4: the last rank's window runs past the experts.
  c.moe.expert_intermediate = 96;
  auto pad = TpPlan::Make(c, 4, -1);
  ASSERT_TRUE(pad.ok());
  EXPECT_EQ(pad->ranks[3].expert_held, (TpRange{64, 64}));
  EXPECT_TRUE(pad->QuantCutOf(c, "model.layers.0.mlp.experts.gate_up_proj", 3).Masks(2 * 96));
}

TEST(TpPlanTest, DegreeOneIsTheWholeModel) {
  const model::ModelConfig c = TpConfig(model::Architecture::kQwen3);
  auto plan = TpPlan::Make(c, 1, 1);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ranks.size(), 1u);
  EXPECT_EQ(plan->RankConfig(c, 0), c);
  for (const model::WeightSpec& s : model::ExpectedWeights(c))
    EXPECT_EQ(plan->CutOf(c, s.name, 0), TensorCut{}) << s.name;
}

TEST(TpPlanTest, SlicesOfEveryTensorTileTheFullTensor) {
  for (model::Architecture arch : kArchs) {
    const model::ModelConfig c = TpConfig(arch);
    for (int degree : {2, 4}) {
      auto plan = TpPlan::Make(c, degree, -1);
      ASSERT_TRUE(plan.ok());
      for (const model::WeightSpec& s : model::ExpectedWeights(c)) {
        std::vector<TensorCut> cuts;
        for (int r = 0; r < degree; ++r) cuts.push_back(plan->CutOf(c, s.name, r));
        if (cuts[0].kind != TensorCut::Kind::kSlice) {
          // Whole on every rank, or the bias of a row-split output: whole
          // on rank 0, zero elsewhere.
          for (int r = 1; r < degree; ++r)
            EXPECT_TRUE(cuts[r].kind == cuts[0].kind || cuts[r].kind == TensorCut::Kind::kZero)
                << s.name;
          EXPECT_EQ(cuts[0].kind, TensorCut::Kind::kWhole) << s.name;
          continue;
        }
        // Slices in order along one dimension, covering it (replicated KV
        // heads: each range repeated kv_replicas times).
        const int rep =
            Contains(s.name, "k_proj") || Contains(s.name, "v_proj") ? plan->kv_replicas : 1;
        int64_t next = 0;
        for (int r = 0; r < degree; r += rep) {
          EXPECT_EQ(cuts[r].dim, cuts[0].dim) << s.name;
          EXPECT_EQ(cuts[r].begin, next) << s.name << " rank " << r;
          next += cuts[r].size;
          for (int q = r; q < r + rep; ++q) EXPECT_EQ(cuts[q], cuts[r]) << s.name;
        }
        EXPECT_EQ(next, s.shape[cuts[0].dim]) << s.name;
      }
    }
  }
}

TEST(TpPlanTest, ReplicatesKvHeadsWhenFewerThanRanks) {
  const model::ModelConfig c = TpConfig(model::Architecture::kLlama);  // 4 heads, 2 KV heads
  auto plan = TpPlan::Make(c, 4, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->kv_replicas, 2);
  const int64_t want_kv[] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(plan->ranks[r].q_heads, (TpRange{r, 1}));
    EXPECT_EQ(plan->ranks[r].kv_heads, (TpRange{want_kv[r], 1}));
    EXPECT_EQ(plan->ranks[r].primary_kv, r % 2 == 0);
    EXPECT_EQ(plan->RankConfig(c, r).num_kv_heads, 1);
  }
}

TEST(TpPlanTest, RefusesWhatDoesNotSplit) {
  const model::ModelConfig c = TpConfig(model::Architecture::kQwen3);
  auto msg = [](const Result<TpPlan>& r) { return r.ok() ? std::string() : r.status().message(); };
  EXPECT_NE(msg(TpPlan::Make(c, 0, 8)).find("at least 1"), std::string::npos);
  // More ranks than GPUs, including none.
  EXPECT_NE(msg(TpPlan::Make(c, 2, 1)).find("needs 2 GPUs; this process sees 1 GPU"),
            std::string::npos);
  EXPECT_NE(msg(TpPlan::Make(c, 2, 0)).find("sees 0 GPUs"), std::string::npos);
  EXPECT_NE(msg(TpPlan::Make(c, 3, 8)).find("attention heads 4"), std::string::npos);
  model::ModelConfig kv = c;
  kv.num_heads = 12;
  kv.num_kv_heads = 6;
  EXPECT_NE(msg(TpPlan::Make(kv, 4, 8)).find("KV heads 6"), std::string::npos);
  model::ModelConfig inter = c;
  inter.intermediate_size = 80;  // 20 a rank at 4
  EXPECT_NE(msg(TpPlan::Make(inter, 4, 8)).find("intermediate size 80"), std::string::npos);
  model::ModelConfig moe = TpConfig(model::Architecture::kQwen3Moe);
  moe.moe.expert_intermediate = 24;
  EXPECT_NE(msg(TpPlan::Make(moe, 2, 8)).find("expert intermediate size 24"), std::string::npos);
  // fp8 block columns of o_proj (32 a rank), down_proj (16 a rank at 4)
  // and the experts' down_proj: blocks left narrower than 16 columns.
  model::ModelConfig fp8 = c;
  fp8.quant.method = model::QuantMethod::kFp8;
  fp8.quant.format = model::QuantFormat::kFp8Block;
  EXPECT_TRUE(TpPlan::Make(fp8, 4, 8).ok());  // 128-column blocks: refined to 32 and 16
  fp8.quant.block_cols = 40;                  // blocks of 8 columns at a rank's boundary
  EXPECT_NE(msg(TpPlan::Make(fp8, 2, 8)).find("self_attn.o_proj.weight: fp8 blocks of 40 columns"),
            std::string::npos)
      << msg(TpPlan::Make(fp8, 2, 8));
  fp8.quant.block_cols = 96;  // o_proj: 32 columns; down_proj at 4: 16
  EXPECT_TRUE(TpPlan::Make(fp8, 4, 8).ok());
  fp8.quant.block_cols = 24;  // o_proj at 2: 8-column blocks
  EXPECT_NE(msg(TpPlan::Make(fp8, 2, 8)).find("o_proj"), std::string::npos);
  fp8.quant.not_converted = {"o_proj"};  // o_proj stays bf16: down_proj is cut next
  EXPECT_NE(msg(TpPlan::Make(fp8, 2, 8)).find("mlp.down_proj.weight"), std::string::npos);
  model::ModelConfig fp8moe = TpConfig(model::Architecture::kQwen3Moe);
  fp8moe.quant = fp8.quant;
  fp8moe.quant.block_cols = 32;
  fp8moe.moe.expert_intermediate = 32;  // 8 a rank at 4
  EXPECT_NE(msg(TpPlan::Make(fp8moe, 4, 8)).find("mlp.experts.*.down_proj.weight"),
            std::string::npos)
      << msg(TpPlan::Make(fp8moe, 4, 8));
  // Per-channel fp8: whole 16-column loads of a rank's columns.
  model::ModelConfig channel = c;
  channel.quant.method = model::QuantMethod::kCompressedTensors;
  channel.quant.format = model::QuantFormat::kFp8Channel;
  channel.intermediate_size = 96;  // 24 a rank at 4
  EXPECT_TRUE(TpPlan::Make(channel, 2, 8).ok());
  EXPECT_NE(msg(TpPlan::Make(channel, 4, 8))
                .find("mlp.down_proj.weight: fp8 columns cut into slices of 24"),
            std::string::npos)
      << msg(TpPlan::Make(channel, 4, 8));
  // MXFP4 experts: slices off the 32-value blocks hold whole blocks
  // (padded); an intermediate size of no whole blocks is refused.
  model::ModelConfig mx = TpConfig(model::Architecture::kGptOss);
  mx.quant.method = model::QuantMethod::kMxfp4;
  mx.quant.format = model::QuantFormat::kMxfp4;
  mx.moe.expert_intermediate = 96;  // 48 a rank
  EXPECT_TRUE(TpPlan::Make(mx, 2, 8).ok());
  mx.moe.expert_intermediate = 80;
  EXPECT_NE(msg(TpPlan::Make(mx, 2, 8)).find("is not whole MXFP4 blocks of 32"), std::string::npos)
      << msg(TpPlan::Make(mx, 2, 8));
  model::ModelConfig vocab = c;
  vocab.vocab_size = 1;
  EXPECT_NE(msg(TpPlan::Make(vocab, 2, 8)).find("vocabulary 1"), std::string::npos);
  model::ModelConfig small_vocab = c;
  small_vocab.vocab_size = 9;  // ceil(9 / 4) = 3: ranks of 3, 3, 3, 0
  EXPECT_NE(msg(TpPlan::Make(small_vocab, 4, 8)).find("leaves the last rank"), std::string::npos);
}

TEST(TpPlanTest, VocabularySplitCombinesEmbeddingArgmaxAndLogSumExp) {
  model::ModelConfig c = TpConfig(model::Architecture::kQwen2);  // untied LM head, vocabulary 97
  const MapWeights w = RandomWeights(c, 3);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  for (int degree : {2, 4}) {
    auto plan = TpPlan::Make(c, degree, -1);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->ranks[0].vocab, (TpRange{0, (V + degree - 1) / degree}));
    EXPECT_EQ(plan->ranks.back().vocab.end(), V);
    const Vec embed = Load(w, "model.embed_tokens.weight", {V, H});
    const Vec head = Load(w, "lm_head.weight", {V, H});
    const Vec h = RandomRows(1, H, 5)[0];
    const Vec logits = MatVec(head, h, V, H);
    for (int32_t tok : {0, 48, 49, 96}) {
      // Each rank embeds the tokens of its range, zeros for the rest.
      Vec sum(H, 0.f);
      for (int r = 0; r < degree; ++r) {
        TpWeightSource s(w, c, *plan, r);
        const TpRange& vr = plan->ranks[r].vocab;
        const Vec e = Load(s, "model.embed_tokens.weight", {vr.size, H});
        if (tok >= vr.begin && tok < vr.end())
          for (int64_t j = 0; j < H; ++j) sum[j] += e[(tok - vr.begin) * H + j];
      }
      EXPECT_EQ(sum, Vec(embed.begin() + tok * H, embed.begin() + (tok + 1) * H));
    }
    // Argmax and log-sum-exp from the ranks' slices, and with a tie across
    // ranks (the lower id wins, as the single-GPU argmax's first maximum).
    for (bool tie : {false, true}) {
      Vec l = logits;
      const int64_t best = std::max_element(l.begin(), l.end()) - l.begin();
      if (tie) l[V - 1] = l[best];
      uint64_t key = 0;
      tp::LseShare lse;
      for (int r = 0; r < degree; ++r) {
        TpWeightSource s(w, c, *plan, r);
        const TpRange& vr = plan->ranks[r].vocab;
        Vec part = MatVec(Load(s, "lm_head.weight", {vr.size, H}), h, vr.size, H);
        if (tie && r == degree - 1) part.back() = l[best];
        const int64_t i = std::max_element(part.begin(), part.end()) - part.begin();
        key = std::max(key, tp::ArgmaxKey(part[i], vr.begin + i));
        tp::LseShare mine{part[i], 0.f};
        for (float v : part) mine.sum += std::exp(v - part[i]);
        lse = tp::CombineLse(lse, mine);
      }
      EXPECT_EQ(tp::ArgmaxKeyId(key), best);
      double z = 0;
      for (float v : l) z += std::exp(static_cast<double>(v) - l[best]);
      EXPECT_NEAR(tp::LogSumExp(lse), l[best] + std::log(z), 1e-4);
    }
  }
}

TEST(TpPlanTest, ArgmaxKeysOrderAsNumbers) {
  const float vals[] = {-INFINITY, -3.5f, -0.f, 0.f, 1e-30f, 2.f, INFINITY};
  for (size_t i = 0; i + 1 < std::size(vals); ++i)
    EXPECT_LE(tp::ArgmaxKey(vals[i], 0), tp::ArgmaxKey(vals[i + 1], 0)) << vals[i];
  EXPECT_LT(tp::ArgmaxKey(NAN, 0), tp::ArgmaxKey(-INFINITY, 5));
  EXPECT_GT(tp::ArgmaxKey(1.f, 3), tp::ArgmaxKey(1.f, 4));  // ties: the lower id
  EXPECT_EQ(tp::ArgmaxKeyId(tp::ArgmaxKey(1.f, 151935)), 151935);
}

TEST(TpPlanTest, KvBlocksMoveBetweenLayoutsWithoutLoss) {
  for (cache::KvDtype dt : {cache::KvDtype::kBF16, cache::KvDtype::kFP8E4M3}) {
    for (model::Architecture arch : {model::Architecture::kLlama, model::Architecture::kGemma3}) {
      const model::ModelConfig c = TpConfig(arch);
      const cache::ModelCacheSpec spec = c.CacheSpec(dt);
      const int bs = 4;
      for (int degree : {2, 4}) {  // 4: KV heads replicated
        auto plan = TpPlan::Make(c, degree, -1);
        ASSERT_TRUE(plan.ok());
        for (size_t g = 0; g < spec.groups.size(); ++g) {
          const int gi = static_cast<int>(g);
          std::vector<std::byte> global(spec.BytesPerBlock(gi, bs));
          std::mt19937 rng(static_cast<uint32_t>(g + 1));
          for (std::byte& b : global) b = static_cast<std::byte>(rng());
          std::vector<std::byte> merged(global.size(), std::byte{0});
          std::vector<std::vector<std::byte>> ranks;
          for (int r = 0; r < degree; ++r) {
            const cache::ModelCacheSpec rs = plan->RankConfig(c, r).CacheSpec(dt);
            std::vector<std::byte> rank(rs.BytesPerBlock(gi, bs), std::byte{0xee});
            const std::vector<TpKvRun> runs = TpKvRuns(spec, *plan, r, gi, bs);
            size_t bytes = 0;
            for (const TpKvRun& run : runs) bytes += run.bytes;
            EXPECT_EQ(bytes, rank.size());  // every byte of the rank block, once
            TpSplitKvBlock(runs, global, rank);
            if (plan->ranks[r].primary_kv) TpMergeKvBlock(runs, rank, merged);
            // A replica holds what its primary holds.
            if (!plan->ranks[r].primary_kv) {
              EXPECT_EQ(rank, ranks.back());
            }
            ranks.push_back(std::move(rank));
          }
          // Each rank holds different heads (or a replica the same).
          if (degree == 2) {
            EXPECT_NE(ranks[0], ranks[1]);
          }
          EXPECT_EQ(merged, global)
              << cache::KvDtypeName(dt) << " degree " << degree << " group " << g;
        }
      }
    }
  }
}

TEST(TpPlanTest, WeightSourceChecksShapesAndNames) {
  const model::ModelConfig c = TpConfig(model::Architecture::kLlama);
  const MapWeights w = RandomWeights(c, 1);
  auto plan = TpPlan::Make(c, 2, -1);
  ASSERT_TRUE(plan.ok());
  TpWeightSource s(w, c, *plan, 1);
  const int64_t H = c.hidden_size, D = c.head_dim;
  // The full shape is not the rank's.
  auto full = s.LoadF32("model.layers.0.self_attn.q_proj.weight", std::vector<int64_t>{4 * D, H});
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("its slice is [32, 48]"), std::string::npos);
  EXPECT_FALSE(s.LoadF32("no.such.tensor", std::vector<int64_t>{1}).ok());
  // Rank 1's q rows are the second half of the full tensor's.
  auto q = s.LoadF32("model.layers.0.self_attn.q_proj.weight", std::vector<int64_t>{2 * D, H});
  ASSERT_TRUE(q.ok());
  const Vec& all = w.t.at("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(*q, Vec(all.begin() + 2 * D * H, all.end()));
  // A quantized load asks for the rank's shape too.
  auto qw = s.LoadQuantized("model.layers.0.self_attn.q_proj.weight", std::vector<int64_t>{1},
                            model::QuantConfig{});
  EXPECT_EQ(qw.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(qw.status().message().find("its slice is [32, 48]"), std::string::npos);
}

// Qwen3-MoE's fused expert tensors (transformers 5's) cut to the same
// values as the per-expert tensors they hold.
TEST(TpPlanTest, FusedQwen3MoeExpertsCutAsPerExpertOnes) {
  const model::ModelConfig c = TpConfig(model::Architecture::kQwen3Moe);
  MapWeights w = RandomWeights(c, 9);
  const int64_t E = c.moe.num_experts, I = c.moe.expert_intermediate, H = c.hidden_size;
  const std::string p = "model.layers.0.mlp.experts.";
  Vec gu, down(E * H * I);
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = p + std::to_string(e) + ".";
    for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
      const Vec& m = w.t.at(q + part);
      gu.insert(gu.end(), m.begin(), m.end());
    }
    const Vec& d = w.t.at(q + "down_proj.weight");
    std::copy(d.begin(), d.end(), down.begin() + e * H * I);
  }
  w.t[p + "gate_up_proj"] = gu;
  w.t[p + "down_proj"] = down;
  auto plan = TpPlan::Make(c, 2, -1);
  ASSERT_TRUE(plan.ok());
  for (int r = 0; r < 2; ++r) {
    TpWeightSource s(w, c, *plan, r);
    const int64_t Ir = plan->ranks[r].expert_intermediate.size;
    const Vec fgu = Load(s, p + "gate_up_proj", {E, 2 * Ir, H});
    const Vec fdown = Load(s, p + "down_proj", {E, H, Ir});
    Vec want_gu, want_down;
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = p + std::to_string(e) + ".";
      for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
        const Vec m = Load(s, q + part, {Ir, H});
        want_gu.insert(want_gu.end(), m.begin(), m.end());
      }
      const Vec d = Load(s, q + "down_proj.weight", {H, Ir});
      want_down.insert(want_down.end(), d.begin(), d.end());
    }
    EXPECT_EQ(fgu, want_gu) << "rank " << r;
    EXPECT_EQ(fdown, want_down) << "rank " << r;
  }
}

}  // namespace
}  // namespace agentkv::backend
