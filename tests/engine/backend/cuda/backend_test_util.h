// Helpers shared by the CUDA backend's tests (backend_test.cc,
// backend_fp8_test.cc): a pager handing out shuffled blocks, a driver that
// runs three batched sequences through a backend, and the backends built
// the same way on both sides. Only for builds with CUDA.
#pragma once

#include <algorithm>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../step_driver.h"
#include "../../test_model.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/backend.h"

namespace agentkv::testing {

inline constexpr int kBlocks = 512;

using Seq = TestSeq;

// Hands each sequence shuffled blocks (the same ids on both backends).
class Pager {
 public:
  Pager(const cache::ModelCacheSpec& spec, int bs)
      : spec_(spec), bs_(bs), free_(spec.groups.size()) {
    std::mt19937 rng(99);
    for (auto& f : free_) {
      f.resize(kBlocks);
      std::iota(f.begin(), f.end(), 0);
      std::shuffle(f.begin(), f.end(), rng);
    }
  }
  void Ensure(Seq& s, int64_t tokens) {
    s.tables.resize(spec_.groups.size());
    for (size_t g = 0; g < spec_.groups.size(); ++g) {
      const int need = spec_.BlocksFor(static_cast<int>(g), tokens, bs_);
      while (static_cast<int>(s.tables[g].size()) < need) {
        s.tables[g].push_back(free_[g].back());
        free_[g].pop_back();
      }
    }
  }

 private:
  const cache::ModelCacheSpec& spec_;
  int bs_;
  std::vector<std::vector<int32_t>> free_;
};

// Runs three sequences through `b`: prompts of 45, 20 and 3 tokens,
// prefilled in chunks of up to `chunk` tokens interleaved with the others'
// steps, then `decode` greedy tokens each, all batched. Returns every
// logits row produced, in order.
inline std::vector<std::vector<float>> Drive(backend::Backend& b, int chunk, int decode,
                                             uint32_t seed,
                                             const std::vector<int32_t>* forced = nullptr,
                                             std::vector<int32_t>* picked = nullptr) {
  const model::ModelConfig& c = b.config();
  const int bs = b.kv_layout().block_size;
  std::mt19937 rng(seed);
  std::vector<Seq> seqs(3);
  const int lens[] = {45, 20, 3};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < lens[i]; ++j)
      seqs[i].tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
  Pager pager(b.cache_spec(), bs);
  std::vector<std::vector<float>> out;
  std::vector<float> logits(3 * c.vocab_size);
  int produced = 0;
  while (produced < decode) {
    std::vector<backend::SeqStep> steps;
    std::vector<Seq*> order;
    for (Seq& s : seqs) {
      const int left = static_cast<int>(s.tokens.size()) - s.computed;
      const int n = std::min(left, chunk);
      pager.Ensure(s, s.computed + n);
      steps.push_back(StepOf(s, n, n == left));
      order.push_back(&s);
    }
    EXPECT_TRUE(b.Forward(steps, logits).ok());
    int r = 0;
    bool all_decoding = true;
    for (size_t i = 0; i < steps.size(); ++i) {
      Seq& s = *order[i];
      s.computed += static_cast<int>(steps[i].tokens.size());
      if (!steps[i].want_logits) {
        all_decoding = false;
        continue;
      }
      std::vector<float> row(logits.begin() + r * c.vocab_size,
                             logits.begin() + (r + 1) * c.vocab_size);
      ++r;
      int32_t next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      if (forced) next = (*forced)[out.size()];
      if (picked) picked->push_back(next);
      s.tokens.push_back(next);
      out.push_back(std::move(row));
    }
    if (all_decoding) ++produced;
  }
  return out;
}

// kBlocks blocks of `bs` tokens in every cache group: whether they were
// allocated.
inline bool AllocateTestKv(backend::Backend& b, int bs) {
  backend::KvLayout layout;
  layout.block_size = bs;
  for (int g = 0; g < backend::kMaxCacheGroups; ++g) layout.blocks_per_group[g] = kBlocks;
  const Status st = b.AllocateKv(layout);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return st.ok();
}

// The backends on `w` (random weights, or a checkpoint's), each with
// kBlocks blocks of `bs` tokens; null (a test failure said) if creation
// fails.
inline std::unique_ptr<backend::Backend> MakeCpu(const model::ModelConfig& c,
                                                 const model::WeightSource& w, int bs,
                                                 cache::KvDtype kv = cache::KvDtype::kF32) {
  auto b = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{2, kv});
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return nullptr;
  AllocateTestKv(**b, bs);
  return std::move(b).value();
}

inline std::unique_ptr<backend::cuda::CudaBackend> MakeCuda(
    const model::ModelConfig& c, const model::WeightSource& w, int bs,
    const backend::CudaTuning& tuning, cache::KvDtype kv = cache::KvDtype::kBF16) {
  backend::cuda::CudaBackendOptions o;
  o.tuning = tuning;
  o.kv_dtype = kv;
  o.max_step_tokens = 64;  // small, so that steps must grow it
  o.max_batch = 2;
  auto b = backend::cuda::CudaBackend::Create(c, w, o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return nullptr;
  AllocateTestKv(**b, bs);
  return std::move(b).value();
}

inline std::unique_ptr<backend::cuda::CudaBackend> MakeCuda(
    const model::ModelConfig& c, const model::WeightSource& w, int bs, bool graphs = true,
    cache::KvDtype kv = cache::KvDtype::kBF16) {
  backend::CudaTuning t;
  t.graphs = graphs;
  return MakeCuda(c, w, bs, t, kv);
}

// Weights rounded to bf16, so both backends run exactly the same model.
inline MapWeights Bf16Weights(const model::ModelConfig& c, uint32_t seed) {
  MapWeights w = RandomWeights(c, seed);
  for (auto& [name, v] : w.t)
    for (auto& x : v) x = RoundBf16(x);
  return w;
}

// SmallConfig with every GEMM dimension a multiple of 64, head_dim 64 and a
// vocabulary of whole 64-wide tiles: shapes the warpgroup GEMM (and the LM
// head's argmax epilogue) takes on compute capability 9.0 devices, which
// the hidden size of 48 never reaches. (Used with q/k norms: without them
// these random heads' attention is so sharp that bf16 rounding alone moved
// some Llama rows past the tolerances, with or without the warpgroup GEMM.)
inline model::ModelConfig WideConfig(model::Architecture arch) {
  model::ModelConfig c = SmallConfig(arch);
  c.hidden_size = 128;
  c.intermediate_size = 192;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.vocab_size = 192;
  // GPT-OSS has no q/k norms: given them here for the reason above (its
  // sinks, biases, YaRN and experts all still run).
  if (arch == model::Architecture::kGptOss) c.qk_norm = true;
  return c;
}

struct ArchCase {
  model::Architecture arch;
  int chunk;
  int block_size;
  bool wide = false;           // WideConfig
  bool fixed_routing = false;  // FixRouting on the weights
};

// Routing that no activation can change: every router weight 0, and the
// router bias (GPT-OSS) a descending ramp, so each token takes the same
// experts with the same weights on any backend (Qwen3-MoE: equal logits,
// the lower ids, weights 1/k). With routing fixed, a mixture-of-experts
// model compares at the dense models' tolerances; with random routers,
// tokens whose k-th and (k+1)-th router logits lie within bf16 noise of
// each other take other experts on the GPU than on the CPU, and that row's
// logits move by a whole expert's share.
inline void FixRouting(const model::ModelConfig& c, MapWeights* w) {
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    for (const char* n : {"router.weight", "gate.weight"}) {
      auto it = w->t.find(p + n);
      if (it != w->t.end() && it->second.size() == static_cast<size_t>(c.moe.num_experts) *
                                                       static_cast<size_t>(c.hidden_size))
        std::fill(it->second.begin(), it->second.end(), 0.f);
    }
    auto b = w->t.find(p + "router.bias");
    if (b != w->t.end())
      for (size_t e = 0; e < b->second.size(); ++e)
        b->second[e] = 2.0f - 0.5f * static_cast<float>(e);
  }
}

inline std::string CaseName(const ArchCase& c) {
  static const char* kNames[] = {"llama",  "qwen2",   "qwen3",    "mistral",
                                 "gemma3", "gpt_oss", "qwen3_moe"};
  return std::string(kNames[static_cast<int>(c.arch)]) + "_c" + std::to_string(c.chunk) + "_b" +
         std::to_string(c.block_size) + (c.wide ? "_wide" : "") + (c.fixed_routing ? "_fixed" : "");
}

}  // namespace agentkv::testing
