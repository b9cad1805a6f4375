// The grouped GEMM's weight-streaming form (moe_gemv.cu), and the tensor
// cores' tiles on quantized weights (moe.cu), against a CPU
// reference of the grouped product: the weights dequantized by the CPU
// backend's DequantizeRows (engine/model/quant_format.h) for fp8 block and
// mxfp4, bf16 as stored; x in bf16 as the kernel reads it; sums in double.
// Random groupings (tokens taking k distinct experts), the three
// epilogues, biases, groups of one row to several passes and several
// 64-row tiles, shapes off every block multiple; outputs poisoned before
// each launch; the tensor cores' tiles on the same cases; the gated forms
// SwiGLU, GPT-OSS's clamped SwiGLU and GELU (tanh) times up. The GEMV runs
// bf16 on the CUDA cores and fp8 / mxfp4 on mma.sync (x staged as f16
// scaled per row), so both forms meet the same bar. Tolerances
// (relative L2): 1e-5 for the fp32 store (the same products in another
// order; 5e-3 for fp8 on the tiles, which round the scaled weights to
// bf16), 1e-2 for the bf16 activations (bf16 rounding alone is ~3e-3).
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/cuda/kernels/moe.h"
#include "engine/model/quant_format.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

// Random fp8 block weights of `batch` matrices rows x cols (codes that are
// not NaN, scales around 2^-6).
model::QuantizedWeight RandomFp8(int batch, int rows, int cols, int br, int bc, std::mt19937& rng) {
  model::QuantizedWeight w;
  w.format = model::QuantFormat::kFp8Block;
  w.shape = {batch, rows, cols};
  w.batch = batch;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = br;
  w.block_cols = bc;
  w.codes.resize(static_cast<size_t>(batch) * rows * cols);
  for (auto& c : w.codes) {
    c = static_cast<uint8_t>(rng() & 0xff);
    if ((c & 0x7f) == 0x7f) c = 0x3f;  // (NaN codes)
  }
  std::uniform_real_distribution<float> ud(0.5f, 2.f);
  w.scales.resize(static_cast<size_t>(batch) * ((rows + br - 1) / br) * ((cols + bc - 1) / bc));
  for (auto& s : w.scales) s = ud(rng) / 64.f;
  EXPECT_TRUE(w.Validate().ok());
  return w;
}

// Random MXFP4 weights (exponents around 2^-3).
model::QuantizedWeight RandomMxfp4(int batch, int rows, int cols, std::mt19937& rng) {
  model::QuantizedWeight w;
  w.format = model::QuantFormat::kMxfp4;
  w.shape = {batch, rows, cols};
  w.batch = batch;
  w.rows = rows;
  w.cols = cols;
  w.codes.resize(static_cast<size_t>(batch) * rows * cols / 2);
  for (auto& c : w.codes) c = static_cast<uint8_t>(rng() & 0xff);
  w.exponents.resize(static_cast<size_t>(batch) * rows * cols / model::kMxfp4Block);
  for (auto& e : w.exponents) e = static_cast<uint8_t>(120 + rng() % 8);
  EXPECT_TRUE(w.Validate().ok());
  return w;
}

std::vector<float> Dequantized(const model::QuantizedWeight& w) {
  std::vector<float> out(static_cast<size_t>(w.batch) * w.rows * w.cols);
  for (int64_t b = 0; b < w.batch; ++b)
    DequantizeRows(w, b, 0, w.rows, out.data() + static_cast<size_t>(b) * w.rows * w.cols);
  return out;
}

// The weights of one case: dequantized on the host ([E][N][K], gate and up
// rows interleaved for the gated forms) and as the kernel reads them.
struct Weights {
  std::vector<float> ref;
  MoeWeightFormat format = MoeWeightFormat::kBf16;
  cuda::DeviceBuffer w, wq, scales, exps;
  int block_rows = 128, block_cols = 128;
  bool scale_pairs = false;
};

// fp8's gated form is built as a checkpoint stores it: gate and up are two
// matrices of N / 2 rows, each with its own blocks; the device gets their
// rows interleaved and the scales paired ([E][2][..]).
Weights MakeWeights(MoeWeightFormat f, int E, int N, int K, bool gated, int br, int bc,
                    std::mt19937& rng) {
  Weights w;
  w.format = f;
  w.block_rows = br;
  w.block_cols = bc;
  if (f == MoeWeightFormat::kBf16) {
    w.ref = Rounded(Random(static_cast<size_t>(E) * N * K, rng, 0.1f));
    w.w = Upload(Bf16Of(w.ref));
  } else if (f == MoeWeightFormat::kMxfp4) {
    const model::QuantizedWeight q = RandomMxfp4(E, N, K, rng);
    w.ref = Dequantized(q);
    w.wq = Upload(q.codes);
    w.exps = Upload(q.exponents);
  } else if (!gated) {
    const model::QuantizedWeight q = RandomFp8(E, N, K, br, bc, rng);
    w.ref = Dequantized(q);
    w.wq = Upload(q.codes);
    w.scales = Upload(q.scales);
  } else {
    const int I = N / 2;
    const model::QuantizedWeight g = RandomFp8(E, I, K, br, bc, rng),
                                 u = RandomFp8(E, I, K, br, bc, rng);
    const std::vector<float> gf = Dequantized(g), uf = Dequantized(u);
    w.ref.resize(static_cast<size_t>(E) * N * K);
    std::vector<uint8_t> codes(w.ref.size());
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < I; ++i)
        for (int part = 0; part < 2; ++part) {
          const size_t src = (static_cast<size_t>(e) * I + i) * K;
          const size_t dst = (static_cast<size_t>(e) * N + 2 * i + part) * K;
          std::copy_n((part == 0 ? gf : uf).data() + src, K, w.ref.data() + dst);
          std::copy_n((part == 0 ? g : u).codes.data() + src, K, codes.data() + dst);
        }
    const size_t per = g.scales.size() / E;
    std::vector<float> scales;
    for (int e = 0; e < E; ++e)
      for (const model::QuantizedWeight* m : {&g, &u})
        scales.insert(scales.end(), m->scales.begin() + e * per, m->scales.begin() + (e + 1) * per);
    w.wq = Upload(codes);
    w.scales = Upload(scales);
    w.scale_pairs = true;
  }
  return w;
}

// x (T x K) times ref (N x K) transposed, in double: the CPU reference of
// one group's product.
std::vector<float> Product(const std::vector<float>& x, const std::vector<float>& ref, int T, int N,
                           int K) {
  std::vector<float> y(static_cast<size_t>(T) * N);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int i = 0; i < K; ++i)
        s += static_cast<double>(x[static_cast<size_t>(t) * K + i]) *
             ref[static_cast<size_t>(n) * K + i];
      y[static_cast<size_t>(t) * N + n] = static_cast<float>(s);
    }
  return y;
}

void Point(MoeGemmParams& p, const Weights& w) {
  p.format = w.format;
  if (w.format == MoeWeightFormat::kBf16) p.w = w.w.get<bf16_t>();
  if (w.format != MoeWeightFormat::kBf16) p.wq = w.wq.get<uint8_t>();
  if (w.format == MoeWeightFormat::kFp8Block) p.scales = w.scales.get<float>();
  if (w.format == MoeWeightFormat::kMxfp4) p.exps = w.exps.get<uint8_t>();
  p.block_rows = w.block_rows;
  p.block_cols = w.block_cols;
  p.scale_pairs = w.scale_pairs;
}

struct GemvCase {
  MoeWeightFormat format;
  MoeEpilogue epilogue;
  int T, E, k, N, K;
  int br = 128, bc = 128;
};

std::string Name(const GemvCase& c) {
  const char* f = c.format == MoeWeightFormat::kBf16       ? "bf16"
                  : c.format == MoeWeightFormat::kFp8Block ? "fp8"
                                                           : "mxfp4";
  const char* ep = c.epilogue == MoeEpilogue::kStore      ? "store"
                   : c.epilogue == MoeEpilogue::kSwiglu   ? "swiglu"
                   : c.epilogue == MoeEpilogue::kGeluTanh ? "gelu"
                                                          : "clamped";
  return std::string(f) + "_" + ep + "_T" + std::to_string(c.T) + "_E" + std::to_string(c.E) +
         "_k" + std::to_string(c.k) + "_N" + std::to_string(c.N) + "_K" + std::to_string(c.K);
}

class CudaMoeGemv : public ::testing::TestWithParam<GemvCase> {};

TEST_P(CudaMoeGemv, MatchesTheGroupedProduct) {
  AGENTKV_REQUIRE_GPU();
  const GemvCase c = GetParam();
  const int T = c.T, E = c.E, k = c.k, N = c.N, K = c.K, A = T * k;
  const bool gated = c.epilogue != MoeEpilogue::kStore;
  std::mt19937 rng(31 + T * 7 + N + K + static_cast<int>(c.format));
  // k distinct experts per token; some tokens crowd expert 0 so that its
  // group takes several passes (and, past 64 rows, several tiles).
  std::vector<int32_t> experts(A);
  std::vector<int> ids(E);
  for (int t = 0; t < T; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    if (t % 2 == 0) std::swap(ids[0], *std::find(ids.begin(), ids.end(), 0));
    std::copy_n(ids.begin(), k, experts.begin() + static_cast<size_t>(t) * k);
  }
  std::vector<int32_t> off(E + 1), tiles(E + 1), order(A), slot(A);
  MoePlanOffsets(experts.data(), A, E, off.data());
  for (int e = 0; e < E; ++e)
    MoePlanExpert(e, experts.data(), A, off.data(), order.data(), slot.data());
  MoePlanTiles(off.data(), E, tiles.data());

  const Weights w = MakeWeights(c.format, E, N, K, gated, c.br, c.bc, rng);
  const auto x = Rounded(Random(static_cast<size_t>(T) * K, rng, 1.f));
  const auto bias = Random(static_cast<size_t>(E) * N, rng, 0.5f);
  // The reference, row by grouped row.
  const int out_n = gated ? N / 2 : N;
  std::vector<float> want(static_cast<size_t>(A) * out_n);
  for (int e = 0; e < E; ++e)
    for (int r = off[e]; r < off[e + 1]; ++r) {
      const float* xr = x.data() + static_cast<size_t>(order[r] / k) * K;
      std::vector<double> v(N);
      for (int n = 0; n < N; ++n) {
        const float* wr = w.ref.data() + (static_cast<size_t>(e) * N + n) * K;
        double s = 0;
        for (int i = 0; i < K; ++i) s += static_cast<double>(xr[i]) * wr[i];
        v[n] = s + bias[static_cast<size_t>(e) * N + n];
      }
      for (int n = 0; n < out_n; ++n) {
        float o;
        if (!gated) {
          o = static_cast<float>(v[n]);
        } else {
          double g = v[2 * n], u = v[2 * n + 1];
          if (c.epilogue == MoeEpilogue::kClampedSwiglu) {
            g = std::min(g, 7.0);
            u = std::clamp(u, -7.0, 7.0);
            o = static_cast<float>((u + 1) * g / (1 + std::exp(-1.702 * g)));
          } else if (c.epilogue == MoeEpilogue::kGeluTanh) {
            const double c0 = 0.7978845608028654;  // sqrt(2 / pi)
            o = static_cast<float>(0.5 * g * (1 + std::tanh(c0 * (g + 0.044715 * g * g * g))) * u);
          } else {
            o = static_cast<float>(g / (1 + std::exp(-g)) * u);
          }
        }
        want[static_cast<size_t>(r) * out_n + n] = o;
      }
    }

  auto dx = Upload(Bf16Of(x)), dbias = Upload(bias), doff = Upload(off), dtiles = Upload(tiles),
       dorder = Upload(order);
  // The GEMV with passes of every size the launcher picks from (the step's
  // token count, as the backend passes it; one row at a time, many passes;
  // unknown), then the tensor cores' tiles (fp8 weights rounded to bf16
  // there: 5e-3 for the fp32 store).
  const MoeGemmPath kGemv = MoeGemmPath::kGemv;
  for (const auto& [path, max_rows] :
       {std::pair{kGemv, T}, std::pair{kGemv, 1}, std::pair{kGemv, 0},
        std::pair{MoeGemmPath::kTensorCores, T}}) {
    auto out = gated ? Poisoned<uint16_t>(want.size()) : Poisoned<float>(want.size());
    MoeGemmParams p;
    p.path = path;
    p.x = dx.get<bf16_t>();
    p.order = dorder.get<int32_t>();
    p.div = k;
    Point(p, w);
    p.bias = dbias.get<float>();
    p.N = N;
    p.K = K;
    p.offsets = doff.get<int32_t>();
    p.tiles = dtiles.get<int32_t>();
    p.num_experts = E;
    p.max_tiles = MoeMaxTiles(A, E);
    p.max_group_rows = max_rows;
    p.epilogue = c.epilogue;
    p.limit = 7.f;
    if (gated)
      p.act = out.get<bf16_t>();
    else
      p.y = out.get<float>();
    ASSERT_EQ(LaunchMoeGemm(p, nullptr), cudaSuccess);
    const auto got = gated ? DownloadBf16(out, want.size()) : Download<float>(out, want.size());
    const double tol = gated                                                     ? 1e-2
                       : path == kGemv || c.format != MoeWeightFormat::kFp8Block ? 1e-5
                                                                                 : 5e-3;
    EXPECT_LT(RelErr(got, want), tol)
        << "path " << static_cast<int>(path) << " max_group_rows " << max_rows;
  }
  // The one-group form (offsets null: `rows` rows of x in order, expert 0).
  if (!gated) {
    auto out = Poisoned<float>(static_cast<size_t>(T) * N);
    MoeGemmParams p;
    p.path = MoeGemmPath::kGemv;
    p.x = dx.get<bf16_t>();
    Point(p, w);
    p.N = N;
    p.K = K;
    p.rows = T;
    p.y = out.get<float>();
    ASSERT_EQ(LaunchMoeGemm(p, nullptr), cudaSuccess);
    const std::vector<float> one = Product(x, w.ref, T, N, K);
    EXPECT_LT(RelErr(Download<float>(out, one.size()), one), 1e-5) << "one group";
  }
}

constexpr auto kBf16 = MoeWeightFormat::kBf16;
constexpr auto kFp8 = MoeWeightFormat::kFp8Block;
constexpr auto kMx = MoeWeightFormat::kMxfp4;
constexpr auto kStore = MoeEpilogue::kStore;
constexpr auto kSwiglu = MoeEpilogue::kSwiglu;
constexpr auto kClamped = MoeEpilogue::kClampedSwiglu;
constexpr auto kGelu = MoeEpilogue::kGeluTanh;

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMoeGemv,
    ::testing::Values(
        // Decode: one token, one row per group; K of one partial round, of
        // several rounds, N off the block's 16 rows.
        GemvCase{kBf16, kSwiglu, 1, 16, 4, 96, 256}, GemvCase{kBf16, kStore, 1, 16, 4, 200, 1096},
        GemvCase{kBf16, kClamped, 3, 8, 2, 48, 2048},
        // Several passes and tiles (expert 0 takes half the tokens).
        GemvCase{kBf16, kStore, 40, 8, 2, 72, 64}, GemvCase{kBf16, kSwiglu, 150, 8, 2, 34, 96},
        // fp8 blocks: ragged row and column blocks, smaller blocks, gate and
        // up scaled apart.
        GemvCase{kFp8, kStore, 1, 16, 4, 200, 400}, GemvCase{kFp8, kSwiglu, 2, 16, 4, 300, 272},
        GemvCase{kFp8, kStore, 9, 8, 3, 130, 2048, 64, 32},
        GemvCase{kFp8, kSwiglu, 70, 4, 2, 100, 160, 16, 16},
        // mxfp4: one block and many per row.
        GemvCase{kMx, kClamped, 1, 16, 4, 64, 2880}, GemvCase{kMx, kStore, 5, 8, 4, 90, 32},
        GemvCase{kMx, kClamped, 33, 8, 4, 40, 576}, GemvCase{kMx, kStore, 80, 4, 2, 24, 128},
        // The quantized GEMV's decode steps of up to 16 tokens in one pass
        // (two token tiles), its warps split over K (wide rows, few groups),
        // rows ending inside a 64-byte chunk (K 400, 2,880: GPT-OSS's 90
        // blocks) or before the first one ends (K 96), and groups of more
        // than 8 rows whose x of 16 rows would not fit (K 4,096: passes of 8).
        GemvCase{kFp8, kSwiglu, 16, 8, 4, 256, 2048}, GemvCase{kFp8, kStore, 16, 4, 1, 64, 400},
        GemvCase{kFp8, kStore, 12, 4, 2, 48, 4096},
        GemvCase{kFp8, kStore, 11, 4, 4, 80, 208, 16, 48},
        GemvCase{kMx, kStore, 16, 8, 4, 128, 2880}, GemvCase{kMx, kSwiglu, 7, 8, 8, 96, 96},
        GemvCase{kMx, kClamped, 16, 32, 4, 2880, 2880},
        // GELU (tanh) of the gate times up, Gemma 3's gated form: every
        // format on the GEMV (one pass, and 16 tokens in one) and the tiles.
        GemvCase{kFp8, kGelu, 2, 16, 4, 300, 272}, GemvCase{kFp8, kGelu, 16, 8, 4, 256, 2048},
        GemvCase{kFp8, kGelu, 70, 4, 2, 100, 160, 16, 16}, GemvCase{kBf16, kGelu, 3, 8, 2, 48, 256},
        GemvCase{kMx, kGelu, 5, 8, 4, 64, 576}),
    [](const auto& info) { return Name(info.param); });

// The one-group form as a dense layer uses it: the product added into a
// residual stream (accumulate), stored as bf16, or through the gated
// GELU (an fp8 Gemma 3 gate_up); on the GEMV and the
// tensor cores (and the CUDA cores for bf16), every format.
TEST(CudaMoeGemv, OneGroupAccumulatesAndStoresBf16) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(77);
  for (const MoeWeightFormat f : {kBf16, kFp8, kMx})
    for (const int T : {1, 5, 70}) {
      const int N = 136, K = 256;
      const Weights w = MakeWeights(f, 1, N, K, false, 128, 128, rng);
      const auto x = Rounded(Random(static_cast<size_t>(T) * K, rng, 1.f));
      const auto bias = Random(N, rng, 0.5f);
      const auto y0 = Random(static_cast<size_t>(T) * N, rng, 1.f);
      std::vector<float> prod(static_cast<size_t>(T) * N);
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < N; ++n) {
          double s = bias[n];
          for (int i = 0; i < K; ++i)
            s += static_cast<double>(x[static_cast<size_t>(t) * K + i]) *
                 w.ref[static_cast<size_t>(n) * K + i];
          prod[static_cast<size_t>(t) * N + n] = static_cast<float>(s);
        }
      std::vector<float> sum(prod.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = y0[i] + prod[i];
      auto dx = Upload(Bf16Of(x)), dbias = Upload(bias);
      std::vector<MoeGemmPath> paths = {MoeGemmPath::kGemv, MoeGemmPath::kTensorCores};
      if (f == kBf16) paths.push_back(MoeGemmPath::kCudaCores);
      for (const MoeGemmPath path : paths) {
        const std::string what = "format " + std::to_string(static_cast<int>(f)) + " T " +
                                 std::to_string(T) + " path " +
                                 std::to_string(static_cast<int>(path));
        MoeGemmParams p;
        p.path = path;
        p.x = dx.get<bf16_t>();
        Point(p, w);
        p.bias = dbias.get<float>();
        p.N = N;
        p.K = K;
        p.rows = T;
        p.max_group_rows = T;
        auto dy = Upload(y0);
        p.y = dy.get<float>();
        p.accumulate = true;
        ASSERT_EQ(LaunchMoeGemm(p, nullptr), cudaSuccess) << what;
        // (fp8 on the tiles: weights rounded to bf16.)
        const bool rounded = f == kFp8 && path == MoeGemmPath::kTensorCores;
        EXPECT_LT(RelErr(Download<float>(dy, sum.size()), sum), rounded ? 5e-3 : 1e-5) << what;
        auto db = Poisoned<uint16_t>(prod.size());
        p.accumulate = false;
        p.y = nullptr;
        p.epilogue = MoeEpilogue::kStoreBf16;
        p.act = db.get<bf16_t>();
        ASSERT_EQ(LaunchMoeGemm(p, nullptr), cudaSuccess) << what;
        EXPECT_LT(RelErr(DownloadBf16(db, prod.size()), prod), 1e-2) << what;
        // Gated (columns 2j gate, 2j + 1 up): GELU (tanh) of the gate times
        // up, as an fp8 Gemma 3 gate_up runs.
        std::vector<float> gelu(prod.size() / 2);
        for (size_t j = 0; j < gelu.size(); ++j) {
          const double g = prod[2 * j], u = prod[2 * j + 1];
          gelu[j] = static_cast<float>(
              0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u);
        }
        auto dg = Poisoned<uint16_t>(gelu.size());
        p.epilogue = MoeEpilogue::kGeluTanh;
        p.act = dg.get<bf16_t>();
        ASSERT_EQ(LaunchMoeGemm(p, nullptr), cudaSuccess) << what;
        EXPECT_LT(RelErr(DownloadBf16(dg, gelu.size()), gelu), 1e-2) << what << " gelu";
      }
    }
}

// The gated epilogues and the forms they compute (gated_act.h): each
// gated form has its epilogue and back; the stores are not gated. (No GPU
// needed.)
TEST(CudaMoeGemv, GatedEpiloguesNameTheirForms) {
  for (const GatedForm f : {GatedForm::kSwiglu, GatedForm::kClampedSwiglu, GatedForm::kGeluTanh}) {
    EXPECT_TRUE(MoeEpilogueGated(MoeGatedEpilogue(f)));
    EXPECT_EQ(MoeEpilogueForm(MoeGatedEpilogue(f)), f);
  }
  EXPECT_EQ(MoeGatedEpilogue(GatedForm::kGeluTanh), MoeEpilogue::kGeluTanh);
  EXPECT_FALSE(MoeEpilogueGated(MoeEpilogue::kStore));
  EXPECT_FALSE(MoeEpilogueGated(MoeEpilogue::kStoreBf16));
}

// The quantized GEMV stages x as f16 scaled per row by a power of two
// picked from the row's largest magnitude: rows far from 1 (large, tiny,
// all zero, magnitudes spread over many decades) come out as exact as rows
// near 1. Each row is checked on its own (a global error would hide the
// tiny one), for steps of 1 to 16 tokens, both formats, fp32 store.
TEST(CudaMoeGemv, QuantizedRowsOfAnyMagnitude) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (const MoeWeightFormat f : {kFp8, kMx})
    for (const int T : {1, 2, 5, 8, 9, 16}) {
      const int N = 96, K = 1024;
      const Weights w = MakeWeights(f, 1, N, K, false, 128, 128, rng);
      auto x = Random(static_cast<size_t>(T) * K, rng, 1.f);
      for (int t = 0; t < T; ++t) {
        float* row = x.data() + static_cast<size_t>(t) * K;
        switch (t % 5) {
          case 0:  // large
            for (int i = 0; i < K; ++i) row[i] *= 3e4f;
            break;
          case 1:  // tiny
            for (int i = 0; i < K; ++i) row[i] *= 1e-7f;
            break;
          case 2:  // zero
            std::fill_n(row, K, 0.f);
            break;
          case 3:  // decades apart
            for (int i = 0; i < K; ++i) row[i] *= std::pow(10.f, static_cast<float>(i % 9) - 4.f);
            break;
          default:
            break;
        }
      }
      x = Rounded(x);
      const std::vector<float> want = Product(x, w.ref, T, N, K);
      auto dx = Upload(Bf16Of(x));
      auto out = Poisoned<float>(want.size());
      MoeGemmParams p;
      p.path = MoeGemmPath::kGemv;
      p.x = dx.get<bf16_t>();
      Point(p, w);
      p.N = N;
      p.K = K;
      p.rows = T;
      p.max_group_rows = T;
      p.y = out.get<float>();
      ASSERT_EQ(LaunchMoeGemm(p, nullptr), cudaSuccess);
      const auto got = Download<float>(out, want.size());
      for (int t = 0; t < T; ++t) {
        const std::vector<float> g(got.begin() + t * N, got.begin() + (t + 1) * N);
        const std::vector<float> r(want.begin() + t * N, want.begin() + (t + 1) * N);
        if (t % 5 == 2) {
          for (int n = 0; n < N; ++n) EXPECT_EQ(g[n], 0.f) << "zero row " << t << " col " << n;
        } else {
          EXPECT_LT(RelErr(g, r), 1e-5)
              << "format " << static_cast<int>(f) << " T " << T << " row " << t;
        }
      }
    }
}

TEST(CudaMoeGemv, RefusesWhatItCannotRead) {
  AGENTKV_REQUIRE_GPU();
  MoeGemmParams p;
  p.path = MoeGemmPath::kGemv;
  float sink = 0.f;
  uint8_t bytes = 0;
  p.y = &sink;
  p.rows = 1;
  p.N = 16;
  p.K = 48;  // fp8 needs whole 16-value loads: fine; mxfp4 needs 32
  p.format = MoeWeightFormat::kMxfp4;
  p.wq = p.exps = &bytes;
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.format = MoeWeightFormat::kFp8Block;
  p.scales = &sink;
  p.block_cols = 24;  // a load would straddle two blocks
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.block_cols = 128;
  p.scales = nullptr;  // no scales
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.format = MoeWeightFormat::kBf16;  // no bf16 weights
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.K = kMaxMoeGemvK + 8;  // x past shared memory
  p.w = reinterpret_cast<const bf16_t*>(&sink);
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  // Quantized weights on the CUDA cores' tiles, or on the tensor cores'
  // in partial loads.
  p.K = 64;
  p.format = MoeWeightFormat::kMxfp4;
  p.path = MoeGemmPath::kCudaCores;
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.path = MoeGemmPath::kTensorCores;
  p.K = 48;
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
  p.path = MoeGemmPath::kUnsupported;
  p.format = MoeWeightFormat::kBf16;
  EXPECT_EQ(LaunchMoeGemm(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaMoeGemv, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
