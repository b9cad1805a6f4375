// The MoE kernels (moe.cu): routing and grouping against moe_plan.h's pure
// functions (exact), and a whole layer (the router from the fp32 residual,
// routing, grouping, gated expert GEMM, down GEMM, weighted sum) against
// the CPU backend's CpuMoe on the same bf16 weights, on each GEMM path,
// for GPT-OSS's form
// (router and expert biases, clamped SwiGLU, top-k then softmax) and
// Qwen3-MoE's (softmax then top-k, renormalised, SwiGLU). Outputs poisoned
// before each launch. Tolerances: 1e-2 relative L2 for the layer (its
// input and activation pass through bf16, as in the dense MLP); 1e-5 for
// the fp32 router logits.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_moe.h"
#include "engine/backend/cuda/kernels/moe.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

TEST(CudaMoe, RouteAndPlanMatchThePureFunctions) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(11);
  // (Expert counts off the warp's multiples, the largest count and top-k
  // the kernels take, and NaN logits, which are never chosen: with E = k
  // = 32 some tokens have fewer usable logits than picks.)
  for (auto [T, E, k] : {std::array{1, 32, 4},
                         {7, 32, 4},
                         {300, 128, 8},
                         {1000, 8, 2},
                         {9, 100, 3},
                         {5, kMaxMoeExperts, kMaxMoeTopK},
                         {6, 32, 32}}) {
    for (bool softmax_first : {false, true}) {
      auto logits = Random(static_cast<size_t>(T) * E, rng, 2.f);
      for (int i = 0; i < T; i += 3)
        logits[static_cast<size_t>(i) * E + 1] = logits[i * E];  // ties
      for (int i = 1; i < T; i += 4) logits[static_cast<size_t>(i) * E + (i % E)] = NAN;
      auto dl = Upload(logits);
      auto de = Poisoned<int32_t>(T * k);
      auto dw = Poisoned<float>(T * k);
      ASSERT_EQ(LaunchMoeRoute(dl.get<float>(), T, E, k, softmax_first, softmax_first,
                               de.get<int32_t>(), dw.get<float>(), nullptr),
                cudaSuccess);
      std::vector<int32_t> want_e(T * k);
      std::vector<float> want_w(T * k);
      for (int t = 0; t < T; ++t)
        MoeRouteToken(&logits[static_cast<size_t>(t) * E], E, k, softmax_first, softmax_first,
                      &want_e[t * k], &want_w[t * k]);
      const auto got_e = Download<int32_t>(de, T * k);
      const auto got_w = Download<float>(dw, T * k);
      const std::string what = "T " + std::to_string(T) + " E " + std::to_string(E);
      EXPECT_EQ(got_e, want_e) << what;
      EXPECT_LT(RelErr(got_w, want_w), 1e-6) << what;

      const int A = T * k;
      auto doff = Poisoned<int32_t>(E + 1), dtiles = Poisoned<int32_t>(E + 1),
           dorder = Poisoned<int32_t>(A), dslot = Poisoned<int32_t>(A);
      ASSERT_EQ(LaunchMoePlan(de.get<int32_t>(), A, E, doff.get<int32_t>(), dtiles.get<int32_t>(),
                              dorder.get<int32_t>(), dslot.get<int32_t>(), nullptr),
                cudaSuccess);
      std::vector<int32_t> off(E + 1), tiles(E + 1), order(A), slot(A);
      MoePlanOffsets(want_e.data(), A, E, off.data());
      for (int e = 0; e < E; ++e)
        MoePlanExpert(e, want_e.data(), A, off.data(), order.data(), slot.data());
      MoePlanTiles(off.data(), E, tiles.data());
      EXPECT_EQ(Download<int32_t>(doff, E + 1), off) << what;
      EXPECT_EQ(Download<int32_t>(dtiles, E + 1), tiles) << what;
      EXPECT_EQ(Download<int32_t>(dorder, A), order) << what;
      EXPECT_EQ(Download<int32_t>(dslot, A), slot) << what;
    }
  }
  // Refused shapes.
  EXPECT_EQ(LaunchMoeRoute(nullptr, 1, 4, 5, false, false, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      LaunchMoeRoute(nullptr, 1, kMaxMoeExperts + 1, 2, false, false, nullptr, nullptr, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(LaunchMoePlan(nullptr, 4, 0, nullptr, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  MoeGemmParams odd;
  odd.N = 7;
  odd.K = 16;
  odd.epilogue = MoeEpilogue::kSwiglu;
  odd.act = reinterpret_cast<bf16_t*>(&odd);
  EXPECT_EQ(LaunchMoeGemm(odd, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchMoeRouterLogits(nullptr, nullptr, 1e-5f, false, nullptr, nullptr, 1,
                                  kMaxMoeRouterHidden + 1, 4, nullptr, nullptr),
            cudaErrorInvalidValue);
  MoeGemmParams tall;  // more row tiles than a grid holds
  tall.N = 8;
  tall.K = 16;
  tall.rows = 65536 * kMoeTileRows;
  tall.y = reinterpret_cast<float*>(&tall);
  EXPECT_EQ(LaunchMoeGemm(tall, nullptr), cudaErrorInvalidValue);
  MoeGemmParams no_tiles = tall;  // groups without their tiles
  no_tiles.rows = 0;
  no_tiles.offsets = reinterpret_cast<const int32_t*>(&tall);
  no_tiles.max_tiles = 1;
  EXPECT_EQ(LaunchMoeGemm(no_tiles, nullptr), cudaErrorInvalidValue);
}

// The router's logits alone against the CPU's fp32 norm and product, for
// token counts that fill the kernel's token groups partly, hidden sizes
// with and without whole 16-byte vectors, and expert counts off the
// block's multiples.
TEST(CudaMoe, RouterLogitsMatchTheCpu) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(23);
  for (auto [T, H, E] :
       {std::array{1, 2048, 128}, {3, 100, 5}, {13, 2048, 128}, {37, 520, 33}, {2, 12288, 8}}) {
    for (const bool gemma : {false, true}) {
      const auto x = Random(static_cast<size_t>(T) * H, rng, 2.f);
      const auto nw = Random(H, rng, 0.2f, gemma ? 0.f : 1.f);
      const auto w = Rounded(Random(static_cast<size_t>(E) * H, rng, 0.3f));
      const auto bias = Random(E, rng, 0.5f);
      std::vector<float> h(x.size()), want(static_cast<size_t>(T) * E);
      cpu::kernels::RmsNorm(x.data(), nw.data(), h.data(), T, H, 1e-5f, gemma);
      cpu::kernels::Linear(h.data(), w.data(), bias.data(), want.data(), T, E, H);
      auto dx = Upload(x), dnw = Upload(nw), dw = Upload(Bf16Of(w)), db = Upload(bias);
      auto out = Poisoned<float>(want.size());
      ASSERT_EQ(
          LaunchMoeRouterLogits(dx.get<float>(), dnw.get<float>(), 1e-5f, gemma, dw.get<bf16_t>(),
                                db.get<float>(), T, H, E, out.get<float>(), nullptr),
          cudaSuccess);
      EXPECT_LT(RelErr(Download<float>(out, want.size()), want), 1e-5)
          << "T " << T << " H " << H << " E " << E << " gemma " << gemma;
    }
  }
}

struct LayerCase {
  bool gpt_oss;
  int T, E, k, H, I;
};

class CudaMoeLayer : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CudaMoeLayer, MatchesCpuMoe) {
  AGENTKV_REQUIRE_GPU();
  const LayerCase lc = GetParam();
  const int T = lc.T, E = lc.E, K = lc.k, H = lc.H, I = lc.I, A = T * K;
  std::mt19937 rng(17 + T + E);
  model::ModelConfig c;
  c.hidden_size = H;
  c.activation = model::Activation::kSilu;
  c.moe.num_experts = E;
  c.moe.experts_per_token = K;
  c.moe.expert_intermediate = I;
  c.moe.routing =
      lc.gpt_oss ? model::MoeRouting::kTopKThenSoftmax : model::MoeRouting::kSoftmaxThenTopK;
  c.moe.router_bias = c.moe.expert_bias = lc.gpt_oss;
  c.moe.norm_topk_prob = !lc.gpt_oss;
  c.moe.swiglu_limit = lc.gpt_oss ? 7.f : 0.f;
  cpu::MoeLayerWeights w;
  w.num_experts = E;
  w.hidden = H;
  w.inter = I;
  w.router = Rounded(Random(static_cast<size_t>(E) * H, rng, 0.3f));
  // (Large enough that the clamp at 7 bites for some gates.)
  w.gate_up = Rounded(Random(static_cast<size_t>(E) * 2 * I * H, rng, 0.4f));
  w.down = Rounded(Random(static_cast<size_t>(E) * H * I, rng, 0.1f));
  if (lc.gpt_oss) {
    w.router_bias = Random(E, rng, 0.5f);
    w.gate_up_bias = Random(static_cast<size_t>(E) * 2 * I, rng, 0.5f);
    w.down_bias = Random(static_cast<size_t>(E) * H, rng, 0.5f);
  }
  // The residual stream and the MLP's norm: the CPU's MoE input is the fp32
  // norm, the GPU's experts get it in bf16 (as the backend's norm kernel
  // leaves it) and its router the fp32 residual.
  const auto x0 = Random(static_cast<size_t>(T) * H, rng, 2.f);
  const auto nw = Random(H, rng, 0.2f, 1.f);
  std::vector<float> h(x0.size());
  cpu::kernels::RmsNorm(x0.data(), nw.data(), h.data(), T, H, 1e-5f, false);
  std::vector<float> want(static_cast<size_t>(T) * H);
  cpu::CpuMoe cpu;
  cpu.Forward(c, w, h.data(), want.data(), T, nullptr);
  for (size_t i = 0; i < want.size(); ++i) want[i] += x0[i];

  // The device layout: per expert [gate rows | up rows] -> interleaved.
  std::vector<float> gu_dev(w.gate_up.size()), gub_dev;
  std::vector<float> one(static_cast<size_t>(2) * I * H);
  for (int e = 0; e < E; ++e) {
    std::copy_n(w.gate_up.data() + static_cast<size_t>(e) * 2 * I * H, one.size(), one.data());
    const auto inter = InterleaveGateUp(one, I, H);
    std::copy(inter.begin(), inter.end(), gu_dev.begin() + static_cast<size_t>(e) * 2 * I * H);
  }
  if (lc.gpt_oss) gub_dev = Interleaved(w.gate_up_bias, E, I);
  auto dh = Upload(Bf16Of(h)), dx0 = Upload(x0), dnw = Upload(nw),
       drouter = Upload(Bf16Of(w.router)), dgu = Upload(Bf16Of(gu_dev)),
       ddown = Upload(Bf16Of(w.down));
  auto drb = Upload(lc.gpt_oss ? w.router_bias : std::vector<float>(1)),
       dgub = Upload(lc.gpt_oss ? gub_dev : std::vector<float>(1)),
       ddb = Upload(lc.gpt_oss ? w.down_bias : std::vector<float>(1));
  auto logits = Poisoned<float>(static_cast<size_t>(T) * E);
  auto experts = Poisoned<int32_t>(A);
  auto weights = Poisoned<float>(A);
  auto off = Poisoned<int32_t>(E + 1), tiles = Poisoned<int32_t>(E + 1),
       order = Poisoned<int32_t>(A), slot = Poisoned<int32_t>(A);

  ASSERT_EQ(LaunchMoeRouterLogits(dx0.get<float>(), dnw.get<float>(), 1e-5f, false,
                                  drouter.get<bf16_t>(), lc.gpt_oss ? drb.get<float>() : nullptr, T,
                                  H, E, logits.get<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchMoeRoute(logits.get<float>(), T, E, K, !lc.gpt_oss, !lc.gpt_oss,
                           experts.get<int32_t>(), weights.get<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchMoePlan(experts.get<int32_t>(), A, E, off.get<int32_t>(), tiles.get<int32_t>(),
                          order.get<int32_t>(), slot.get<int32_t>(), nullptr),
            cudaSuccess);
  // The expert GEMMs on each path (the tensor cores', the CUDA cores', the
  // GEMV's), each from a fresh x and poisoned intermediates.
  for (const MoeGemmPath path :
       {MoeGemmPath::kTensorCores, MoeGemmPath::kCudaCores, MoeGemmPath::kGemv}) {
    // (The GEMV takes whole 16-byte rows only.)
    if (path == MoeGemmPath::kGemv && !(MoeGemvTakes(2 * I, H, MoeWeightFormat::kBf16) &&
                                        MoeGemvTakes(H, I, MoeWeightFormat::kBf16)))
      continue;
    auto act = Poisoned<uint16_t>(static_cast<size_t>(A) * I);
    auto y = Poisoned<float>(static_cast<size_t>(A) * H);
    auto dx = Upload(x0);
    MoeGemmParams g;
    g.x = dh.get<bf16_t>();
    g.order = order.get<int32_t>();
    g.div = K;
    g.w = dgu.get<bf16_t>();
    g.bias = lc.gpt_oss ? dgub.get<float>() : nullptr;
    g.N = 2 * I;
    g.K = H;
    g.offsets = off.get<int32_t>();
    g.tiles = tiles.get<int32_t>();
    g.num_experts = E;
    g.max_tiles = MoeMaxTiles(A, E);
    g.epilogue = lc.gpt_oss ? MoeEpilogue::kClampedSwiglu : MoeEpilogue::kSwiglu;
    g.limit = 7.f;
    g.act = act.get<bf16_t>();
    g.path = path;
    g.max_group_rows = T;
    ASSERT_EQ(LaunchMoeGemm(g, nullptr), cudaSuccess);
    MoeGemmParams d = g;
    d.x = act.get<bf16_t>();
    d.order = nullptr;
    d.div = 1;
    d.w = ddown.get<bf16_t>();
    d.bias = lc.gpt_oss ? ddb.get<float>() : nullptr;
    d.N = H;
    d.K = I;
    d.epilogue = MoeEpilogue::kStore;
    d.act = nullptr;
    d.y = y.get<float>();
    ASSERT_EQ(LaunchMoeGemm(d, nullptr), cudaSuccess);
    ASSERT_EQ(LaunchMoeCombine(y.get<float>(), slot.get<int32_t>(), weights.get<float>(), T, K, H,
                               dx.get<float>(), nullptr),
              cudaSuccess);
    const auto got = Download<float>(dx, static_cast<size_t>(T) * H);
    // Compare the MoE part (x0 added to both would hide errors).
    std::vector<float> got_moe(got.size()), want_moe(want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      got_moe[i] = got[i] - x0[i];
      want_moe[i] = want[i] - x0[i];
    }
    EXPECT_LT(RelErr(got_moe, want_moe), 1e-2) << "path " << static_cast<int>(path);
  }
  // The router logits in fp32, as the CPU's (another summation order).
  std::vector<float> want_logits(static_cast<size_t>(T) * E);
  cpu::kernels::Linear(h.data(), w.router.data(), lc.gpt_oss ? w.router_bias.data() : nullptr,
                       want_logits.data(), T, E, H);
  EXPECT_LT(RelErr(Download<float>(logits, want_logits.size()), want_logits), 1e-5);
  // The GEMM's one-group form (rows given, no grouping) on both kinds of
  // core: the same product from the bf16 norm.
  std::vector<float> hb = Rounded(h), want_one(static_cast<size_t>(T) * E);
  cpu::kernels::Linear(hb.data(), w.router.data(), lc.gpt_oss ? w.router_bias.data() : nullptr,
                       want_one.data(), T, E, H);
  for (const MoeGemmPath path :
       {MoeGemmPath::kTensorCores, MoeGemmPath::kCudaCores, MoeGemmPath::kGemv}) {
    auto one = Poisoned<float>(static_cast<size_t>(T) * E);
    MoeGemmParams g;
    g.x = dh.get<bf16_t>();
    g.w = drouter.get<bf16_t>();
    g.bias = lc.gpt_oss ? drb.get<float>() : nullptr;
    g.N = E;
    g.K = H;
    g.rows = T;
    g.y = one.get<float>();
    g.path = path;
    ASSERT_EQ(LaunchMoeGemm(g, nullptr), cudaSuccess);
    EXPECT_LT(RelErr(Download<float>(one, want_one.size()), want_one), 1e-5)
        << "path " << static_cast<int>(path);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMoeLayer,
    ::testing::Values(
        // Decode-sized (one row tile per expert) and prefill-sized
        // batches; hidden and intermediate sizes off the tiles' multiples.
        LayerCase{true, 1, 32, 4, 192, 96}, LayerCase{true, 5, 8, 4, 200, 72},
        LayerCase{true, 130, 16, 4, 256, 130}, LayerCase{false, 1, 64, 8, 128, 48},
        LayerCase{false, 40, 32, 8, 96, 40}, LayerCase{false, 257, 16, 2, 160, 64},
        // Groups of more than one 64-row tile each.
        LayerCase{true, 300, 8, 4, 128, 64}, LayerCase{false, 200, 4, 2, 64, 32}),
    [](const auto& info) {
      const LayerCase& c = info.param;
      return std::string(c.gpt_oss ? "gpt_oss" : "qwen3_moe") + "_T" + std::to_string(c.T) + "_E" +
             std::to_string(c.E) + "_k" + std::to_string(c.k);
    });

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaMoe, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
