// Each CUDA kernel against its CPU reference (engine/backend/cpu/cpu_kernels.h) on fresh
// random inputs, outputs poisoned with NaN before the launch so an unwritten
// element fails. Tolerances (relative L2 error): 1e-2 where the kernel's
// output is bf16 (rounding alone is ~3e-3); 2e-2 for attention, whose
// probabilities also pass through bf16 on the tensor cores; 1e-5 for the
// decode GEMV's fp32 output (same products, another summation order); exact
// for argmax.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "engine/backend/cpu/cpu_kernels.h"
#include "engine/backend/cuda/kernels/kernels.h"
#include "engine/backend/rope.h"

namespace agentkv {
namespace {

using namespace agentkv::testing;

std::vector<float> Random(size_t n, std::mt19937& rng, float sd = 1.f, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
std::vector<uint16_t> Bf16Of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = ToBf16(v[i]);
  return b;
}
std::vector<float> Rounded(std::vector<float> v) {
  for (auto& x : v) x = RoundBf16(x);
  return v;
}

TEST(CudaKernels, RmsNorm) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(1);
  for (bool plus_one : {false, true}) {
    // 48 to 4096: the vectorised kernel; 50 and 10000 the scalar one. 300
    // rows: the vectorised kernel's layout for many rows (prefill).
    for (int dim : {48, 50, 2048, 4096, 10000})
      for (int rows : {7, 300}) {
        auto x = Random(rows * dim, rng, 2.f);
        auto w = Random(dim, rng, 0.2f, plus_one ? 0.f : 1.f);
        std::vector<int32_t> idx = {3, 0, 6};
        auto dx = Upload(x), dw = Upload(w), di = Upload(idx);
        auto out = Poisoned<uint16_t>(rows * dim);
        ASSERT_EQ(cuda::LaunchRmsNorm(dx.get<float>(), nullptr, dw.get<float>(),
                                      out.get<cuda::bf16_t>(), rows, dim, 1e-6f, plus_one, nullptr),
                  cudaSuccess);
        std::vector<float> ref(rows * dim);
        kernels::RmsNorm(x.data(), w.data(), ref.data(), rows, dim, 1e-6f, plus_one);
        EXPECT_LT(RelErr(DownloadBf16(out, rows * dim), ref), 1e-2) << dim << " " << plus_one;
        // Gathered rows (the final norm of the logits rows).
        auto out2 = Poisoned<uint16_t>(3 * dim);
        ASSERT_EQ(cuda::LaunchRmsNorm(dx.get<float>(), di.get<int32_t>(), dw.get<float>(),
                                      out2.get<cuda::bf16_t>(), 3, dim, 1e-6f, plus_one, nullptr),
                  cudaSuccess);
        std::vector<float> ref2;
        for (int r : idx)
          ref2.insert(ref2.end(), ref.begin() + r * dim, ref.begin() + (r + 1) * dim);
        EXPECT_LT(RelErr(DownloadBf16(out2, 3 * dim), ref2), 1e-2);
      }
  }
}

TEST(CudaKernels, AddNormed) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(2);
  const int rows = 5, dim = 1152;
  auto o = Random(rows * dim, rng), x = Random(rows * dim, rng);
  auto w1 = Random(dim, rng, 0.2f), w2 = Random(dim, rng, 0.2f);
  auto d_o = Upload(o), dx = Upload(x), dw1 = Upload(w1), dw2 = Upload(w2);
  auto h = Poisoned<uint16_t>(rows * dim);
  ASSERT_EQ(
      cuda::LaunchAddNormed(d_o.get<float>(), dw1.get<float>(), dx.get<float>(), dw2.get<float>(),
                            h.get<cuda::bf16_t>(), rows, dim, 1e-6f, true, nullptr),
      cudaSuccess);
  std::vector<float> on(rows * dim), hr(rows * dim), xr = x;
  kernels::RmsNorm(o.data(), w1.data(), on.data(), rows, dim, 1e-6f, true);
  for (size_t i = 0; i < xr.size(); ++i) xr[i] += on[i];
  kernels::RmsNorm(xr.data(), w2.data(), hr.data(), rows, dim, 1e-6f, true);
  EXPECT_LT(RelErr(Download<float>(dx, rows * dim), xr), 1e-5);
  EXPECT_LT(RelErr(DownloadBf16(h, rows * dim), hr), 1e-2);
}

// From the fp32 projection and from a bf16 one (prefill steps), against the
// CPU norm and rotary of the same (bf16-rounded) values.
TEST(CudaKernels, QkvPostMatchesNormAndRope) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(3);
  // 600 tokens: one block per token, so each warp takes several heads
  // (loaded together in the specialised kernels).
  for (const bool bf16_in : {false, true})
    for (auto [D, T] : {std::pair{16, 6}, {64, 6}, {128, 6}, {256, 6}, {64, 600}, {128, 600}}) {
      const int nh = 8, nkv = 2, heads = nh + 2 * nkv;
      RopeSpec rope;
      rope.theta = 500000.f;
      rope.type = "llama3";
      rope.factor = 8.f;
      rope.original_max_position = 1024;
      const auto inv = kernels::RopeInvFreq(rope, D);
      std::vector<int32_t> pos = {0, 1, 17, 300, 4095, 70000};
      for (int t = 6; t < T; ++t) pos.push_back(t * 37);
      auto qkv = Random(T * heads * D, rng);
      if (bf16_in) qkv = Rounded(qkv);
      auto bias = Random(heads * D, rng, 0.1f);
      auto qn = Random(D, rng, 0.1f, 1.f), kn = Random(D, rng, 0.1f, 1.f);
      auto dqkv = bf16_in ? Upload(Bf16Of(qkv)) : Upload(qkv), db = Upload(bias), dqn = Upload(qn),
           dkn = Upload(kn), dinv = Upload(inv), dpos = Upload(pos);
      auto q = Poisoned<uint16_t>(T * nh * D), k = Poisoned<uint16_t>(T * nkv * D),
           v = Poisoned<uint16_t>(T * nkv * D);
      const cudaError_t e =
          bf16_in ? cuda::LaunchQkvPost(dqkv.get<cuda::bf16_t>(), db.get<float>(), dqn.get<float>(),
                                        dkn.get<float>(), dinv.get<float>(), dpos.get<int32_t>(), T,
                                        nh, nkv, D, 1e-6f, false, q.get<cuda::bf16_t>(),
                                        k.get<cuda::bf16_t>(), v.get<cuda::bf16_t>(), nullptr)
                  : cuda::LaunchQkvPost(dqkv.get<float>(), db.get<float>(), dqn.get<float>(),
                                        dkn.get<float>(), dinv.get<float>(), dpos.get<int32_t>(), T,
                                        nh, nkv, D, 1e-6f, false, q.get<cuda::bf16_t>(),
                                        k.get<cuda::bf16_t>(), v.get<cuda::bf16_t>(), nullptr);
      ASSERT_EQ(e, cudaSuccess);
      std::vector<float> rq, rk, rv;
      for (int t = 0; t < T; ++t) {
        std::vector<float> row(qkv.begin() + t * heads * D, qkv.begin() + (t + 1) * heads * D);
        for (int i = 0; i < heads * D; ++i) row[i] += bias[i];
        float* qp = row.data();
        float* kp = qp + nh * D;
        kernels::RmsNorm(qp, qn.data(), qp, nh, D, 1e-6f, false);
        kernels::RmsNorm(kp, kn.data(), kp, nkv, D, 1e-6f, false);
        kernels::ApplyRope(qp, nh, D, pos[t], inv.data());
        kernels::ApplyRope(kp, nkv, D, pos[t], inv.data());
        rq.insert(rq.end(), qp, qp + nh * D);
        rk.insert(rk.end(), kp, kp + nkv * D);
        rv.insert(rv.end(), kp + nkv * D, kp + 2 * nkv * D);
      }
      EXPECT_LT(RelErr(DownloadBf16(q, rq.size()), rq), 1e-2) << D << " " << T << " " << bf16_in;
      EXPECT_LT(RelErr(DownloadBf16(k, rk.size()), rk), 1e-2) << D << " " << T << " " << bf16_in;
      EXPECT_LT(RelErr(DownloadBf16(v, rv.size()), rv), 1e-2) << D << " " << T << " " << bf16_in;
      if (!bf16_in || D != 64) continue;
      // Prompt steps whose attention reads the cache: K and V into the
      // paged cache only (k, v null), q as before. Token t is the only
      // token of sequence t, its row in block t.
      const int bs = 16, row = nkv * D;
      int width = 0;
      for (int p : pos) width = std::max(width, p / bs + 1);
      std::vector<int32_t> tables(static_cast<size_t>(T) * width, 0), tok_seq(T);
      for (int t = 0; t < T; ++t) {
        tables[static_cast<size_t>(t) * width + pos[t] / bs] = t;
        tok_seq[t] = t;
      }
      auto dtab = Upload(tables), dts = Upload(tok_seq), dw = Upload(std::vector<int32_t>{width});
      auto cache = Poisoned<uint16_t>(static_cast<size_t>(T) * 2 * bs * row);
      auto q2 = Poisoned<uint16_t>(T * nh * D);
      cuda::KvCacheView view;
      view.base = cache.get<cuda::bf16_t>();
      view.block_stride = 2 * bs * row;
      view.block_size = bs;
      view.tables = dtab.get<int32_t>();
      view.table_stride = dw.get<int32_t>();
      ASSERT_EQ(cuda::LaunchQkvPostStore(
                    dqkv.get<cuda::bf16_t>(), db.get<float>(), dqn.get<float>(), dkn.get<float>(),
                    dinv.get<float>(), dpos.get<int32_t>(), dts.get<int32_t>(), T, nh, nkv, D,
                    1e-6f, false, q2.get<cuda::bf16_t>(), nullptr, nullptr, view, nullptr),
                cudaSuccess);
      EXPECT_EQ(DownloadBf16(q2, rq.size()), DownloadBf16(q, rq.size())) << T;
      const std::vector<float> all = DownloadBf16(cache, static_cast<size_t>(T) * 2 * bs * row);
      std::vector<float> ck, cv;
      for (int t = 0; t < T; ++t) {
        const size_t at = static_cast<size_t>(t) * 2 * bs * row + (pos[t] % bs) * row;
        ck.insert(ck.end(), all.begin() + at, all.begin() + at + row);
        cv.insert(cv.end(), all.begin() + at + bs * row, all.begin() + at + bs * row + row);
      }
      EXPECT_EQ(ck, DownloadBf16(k, rk.size())) << T;
      EXPECT_EQ(cv, DownloadBf16(v, rv.size())) << T;
    }
}

// gate_up rows [gate | up] (the CPU reference's layout) as the CUDA kernels
// take them: gate and up interleaved.
std::vector<float> Interleaved(const std::vector<float>& gu, int rows, int n) {
  std::vector<float> out(gu.size());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) {
      out[(static_cast<size_t>(r) * n + i) * 2] = gu[static_cast<size_t>(r) * 2 * n + i];
      out[(static_cast<size_t>(r) * n + i) * 2 + 1] = gu[static_cast<size_t>(r) * 2 * n + n + i];
    }
  return out;
}

TEST(CudaKernels, GatedActivation) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(4);
  // Multiples of 4 take the vectorised kernel; 260 rows its layout for many
  // rows (prefill).
  for (int rows : {3, 260})
    for (int n : {1000, 1001, 8192})
      for (Activation a : {Activation::kSilu, Activation::kGeluTanh}) {
        auto gu = Rounded(Random(rows * 2 * n, rng, 2.f));
        auto d = Upload(Bf16Of(Interleaved(gu, rows, n)));
        auto out = Poisoned<uint16_t>(rows * n);
        ASSERT_EQ(cuda::LaunchGatedAct(d.get<cuda::bf16_t>(), out.get<cuda::bf16_t>(), rows, n,
                                       a == Activation::kSilu ? 0 : 1, nullptr),
                  cudaSuccess);
        std::vector<float> ref(rows * n);
        kernels::GatedActivation(gu.data(), ref.data(), rows, n, a);
        EXPECT_LT(RelErr(DownloadBf16(out, rows * n), ref), 1e-2) << n << " " << rows;
      }
}

// Points p at a step's metadata on the device (positions, sequence starts
// and first tokens, tiles as {seq, t0, n}) and sets its shape.
void SetStep(cuda::AttentionParams& p, const cuda::DeviceBuffer& pos,
             const cuda::DeviceBuffer& seq_start, const cuda::DeviceBuffer& seq_first,
             std::array<const cuda::DeviceBuffer*, 3> tiles, int num_tiles, int tokens, int nh,
             int nkv, int head_dim) {
  p.pos = pos.get<int32_t>();
  p.seq_start = seq_start.get<int32_t>();
  p.seq_first = seq_first.get<int32_t>();
  p.tile_seq = tiles[0]->get<int32_t>();
  p.tile_t0 = tiles[1]->get<int32_t>();
  p.tile_n = tiles[2]->get<int32_t>();
  p.num_tiles = num_tiles;
  p.tokens = tokens;
  p.nh = nh;
  p.nkv = nkv;
  p.head_dim = head_dim;
}

// [gate rows | up rows] (the CPU reference's layout) -> gate and up rows
// interleaved (the backend's).
std::vector<float> InterleaveGateUp(const std::vector<float>& w, int n, int k) {
  std::vector<float> wi(w.size());
  for (int i = 0; i < n; ++i) {
    std::copy_n(w.begin() + static_cast<size_t>(i) * k, k,
                wi.begin() + static_cast<size_t>(2 * i) * k);
    std::copy_n(w.begin() + static_cast<size_t>(n + i) * k, k,
                wi.begin() + static_cast<size_t>(2 * i + 1) * k);
  }
  return wi;
}

// A gate_up GEMV's bf16 output [m][n] against the CPU reference: Linear of
// x on [gate rows | up rows] w, then GatedActivation.
void ExpectLinearThenGated(const cuda::DeviceBuffer& out, const std::vector<float>& x,
                           const std::vector<float>& w, int m, int n, int k, Activation a) {
  std::vector<float> gu(static_cast<size_t>(m) * 2 * n), ref(static_cast<size_t>(m) * n);
  kernels::Linear(x.data(), w.data(), nullptr, gu.data(), m, 2 * n, k);
  kernels::GatedActivation(gu.data(), ref.data(), m, n, a);
  EXPECT_LT(RelErr(DownloadBf16(out, ref.size()), ref), 1e-2) << m << " " << n << " " << k;
}

// The GEMV with the activation in its epilogue against Linear, then the
// CPU GatedActivation, on weights whose gate and up rows are interleaved.
TEST(CudaKernels, GemvGatedActMatchesLinearThenActivation) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(12);
  for (int m = 1; m <= cuda::kMaxGemvActRows; ++m)
    for (auto [n, k] : {std::pair{16384, 2048}, std::pair{1000, 4096}, std::pair{74, 264}})
      for (Activation a : {Activation::kSilu, Activation::kGeluTanh}) {
        ASSERT_TRUE(cuda::GemvGatedActSupported(m, 2 * n, k));
        const auto x = Rounded(Random(m * k, rng));
        // [gate rows | up rows], the layout of the CPU reference.
        const auto w = Rounded(Random(static_cast<size_t>(2 * n) * k, rng, 0.05f));
        auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(InterleaveGateUp(w, n, k)));
        auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
        ASSERT_EQ(cuda::LaunchGemvGatedAct(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(),
                                           out.get<cuda::bf16_t>(), m, 2 * n, k,
                                           a == Activation::kSilu ? 0 : 1, nullptr),
                  cudaSuccess);
        ExpectLinearThenGated(out, x, w, m, n, k, a);
      }
  EXPECT_FALSE(cuda::GemvGatedActSupported(cuda::kMaxGemvActRows + 1, 16384, 2048));
  EXPECT_FALSE(cuda::GemvGatedActSupported(1, 1001, 2048));  // odd: not whole pairs
}

TEST(CudaKernels, GemvMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (int m = 1; m <= cuda::kMaxGemvRows; ++m) {
    // (k >= 8192: the pipelined kernel, 8,456 ending in a partial stage.)
    for (auto [n, k] :
         {std::pair{3072, 2048}, std::pair{2048, 8192}, std::pair{37, 264}, std::pair{300, 8456}}) {
      if (!cuda::GemvSupported(m, k)) continue;
      // pipe false: every shape on the plain kernel (CudaTuning::gemv_pipe).
      for (bool f32 : {true, false})
        for (bool pipe : {true, false}) {
          const auto x = Rounded(Random(m * k, rng)),
                     w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
          const auto y0 = Rounded(Random(m * n, rng));
          auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
          cuda::DeviceBuffer dy = f32 ? Upload(y0) : Upload(Bf16Of(y0));
          const float beta = f32 ? 1.f : 0.f;
          ASSERT_EQ(cuda::LaunchGemv(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(), dy.get(), f32,
                                     m, n, k, beta, 132, nullptr, pipe),
                    cudaSuccess);
          std::vector<float> ref(m * n);
          kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
          for (int i = 0; i < m * n; ++i) ref[i] += beta * y0[i];
          const auto got = f32 ? Download<float>(dy, m * n) : DownloadBf16(dy, m * n);
          EXPECT_LT(RelErr(got, ref), f32 ? 1e-5 : 1e-2)
              << m << " " << n << " " << k << " pipe " << pipe;
        }
    }
  }
}

// The tensor-core skinny GEMM at 1 to 8 rows, with K whole in one block and split across the blocks
// of a cluster, N not a multiple of the 128-feature tile. Launched twice: the second result must be
// bit-identical (the partials of a split K are added in a fixed order).
// Runs `launch(x, w, y, beta)` twice for y = x . w^T (+ y0, fp32 with beta
// 1; bf16, poisoned, with beta 0) against the CPU Linear: within 1e-5
// (fp32) or 1e-2 (bf16), and the same bits both times.
template <typename Launch>
void CheckGemmAgainstLinear(int m, int n, int k, bool f32, std::mt19937& rng,
                            const std::string& what, Launch launch) {
  const auto x = Rounded(Random(m * k, rng)),
             w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
  const auto y0 = Rounded(Random(m * n, rng));
  auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
  const float beta = f32 ? 1.f : 0.f;
  std::vector<float> ref(m * n);
  kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
  for (int i = 0; i < m * n; ++i) ref[i] += beta * y0[i];
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    cuda::DeviceBuffer dy = f32 ? Upload(y0) : Poisoned<uint16_t>(m * n);
    ASSERT_EQ(launch(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(), dy.get(), beta), cudaSuccess)
        << what;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    const auto got = f32 ? Download<float>(dy, m * n) : DownloadBf16(dy, m * n);
    EXPECT_LT(RelErr(got, ref), f32 ? 1e-5 : 1e-2) << what;
    if (rep == 0) {
      first = got;
    } else {
      EXPECT_EQ(got, first) << what;
    }
  }
}

TEST(CudaKernels, SkinnyGemmMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(10);
  const int sms = 132;
  for (auto [n, k] : {std::pair{3072, 2048}, std::pair{2048, 8192}, std::pair{16384, 2048},
                      std::pair{200, 384}}) {
    for (int m : {1, 3, 7, 8}) {
      ASSERT_TRUE(cuda::SkinnyGemmSupported(m, n, k));
      const bool f32 = m % 2 == 1;
      CheckGemmAgainstLinear(
          m, n, k, f32, rng,
          std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) + " splits " +
              std::to_string(cuda::SkinnyGemmSplits(n, k, sms)),
          [&](const cuda::bf16_t* x, const cuda::bf16_t* w, void* y, float beta) {
            return cuda::LaunchSkinnyGemm(x, w, y, f32, m, n, k, beta, sms, nullptr);
          });
    }
  }
  EXPECT_GT(cuda::SkinnyGemmSplits(3072, 2048, sms), 1);
  EXPECT_EQ(cuda::SkinnyGemmSplits(128256, 2048, sms), 1);
  EXPECT_FALSE(cuda::SkinnyGemmSupported(cuda::kMaxSkinnyRows + 1, 2048, 2048));
  EXPECT_FALSE(cuda::SkinnyGemmSupported(8, 2048, 2112));
}

// The SM count of device 0 if its compute capability is 9.0 (the warpgroup
// GEMM's), else 0.
int Cc90Sms() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0)
    return 0;
  return prop.multiProcessorCount;
}

// The warpgroup GEMM against the CPU Linear: row counts that leave part of
// the 64-row tile empty, both tile widths, K split 1-8 ways (the default
// plan and forced ones; the split counters must be back at zero for each
// next launch), fp32 output with the residual added and bf16 output; the
// same bits on a second run; and the gated-activation epilogue.
TEST(CudaKernels, WgmmaGemmMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(12);
  auto ws = Poisoned<float>(cuda::WgmmaGemmWorkspaceBytes(sms) / 4);
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.bytes()), cudaSuccess);
  const cuda::WgmmaGemmWorkspace wws{ws.get(), sms};
  struct Case {
    int m, n, k;
    cuda::WgmmaGemmPlan plan;
  };
  const std::vector<Case> cases = {{64, 3072, 2048, {}},
                                   {40, 2048, 8192, {}},
                                   {9, 16384, 2048, {}},
                                   {33, 2048, 2048, {}},
                                   {64, 192, 320, {64, 5}},
                                   {17, 256, 512, {128, 8}},
                                   {64, 512, 1024, {128, 2}},
                                   {50, 512, 4096, {64, 2}},
                                   {24, 384, 2048, {128, 4}},
                                   {64, 512, 4096, {64, 2, true}},
                                   {24, 384, 2048, {128, 4, true}},
                                   {40, 256, 1024, {64, 1, true}},
                                   {1, 128, 64, {64, 1}}};
  for (const Case& c : cases) {
    const int m = c.m, n = c.n, k = c.k;
    ASSERT_TRUE(cuda::WgmmaGemmSupported(m, n, k));
    for (const bool f32 : {true, false})
      CheckGemmAgainstLinear(
          m, n, k, f32, rng,
          std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) + " tile " +
              std::to_string(c.plan.tile) + " splits " + std::to_string(c.plan.splits),
          [&](const cuda::bf16_t* x, const cuda::bf16_t* w, void* y, float beta) {
            return cuda::LaunchWgmmaGemm(x, w, y, f32, m, n, k, beta, wws, nullptr, -1, false,
                                         c.plan);
          });
  }
  // The gated activation in the epilogue, with and without split K: against
  // Linear then the CPU GatedActivation.
  for (auto [m, n, k, splits] : {std::array{64, 8192, 2048, 1}, std::array{9, 8192, 2048, 1},
                                 std::array{33, 512, 1024, 4}, std::array{64, 96, 2048, 3}})
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
      const auto x = Rounded(Random(m * k, rng));
      const auto w = Rounded(Random(static_cast<size_t>(2 * n) * k, rng, 0.05f));
      auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(InterleaveGateUp(w, n, k)));
      auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
      ASSERT_EQ(cuda::LaunchWgmmaGemm(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(), out.get(),
                                      false, m, 2 * n, k, 0.f, wws, nullptr,
                                      act == Activation::kSilu ? 0 : 1, false, {64, splits, true}),
                cudaSuccess);
      ExpectLinearThenGated(out, x, w, m, n, k, act);
    }
  EXPECT_EQ(
      cuda::LaunchWgmmaGemm(nullptr, nullptr, nullptr, true, 64, 128, 128, 0.f, wws, nullptr, 0),
      cudaErrorInvalidValue);  // the activation writes bf16
  const cuda::WgmmaGemmPlan o = cuda::WgmmaGemmPlanFor(2048, 2048, 132);
  EXPECT_EQ(o.tile, 64);
  EXPECT_GT(o.splits, 1);
  EXPECT_EQ(cuda::WgmmaGemmPlanFor(128256, 2048, 132).splits, 1);
  EXPECT_FALSE(cuda::WgmmaGemmSupported(cuda::kMaxWgmmaRows + 1, 2048, 2048));
  EXPECT_FALSE(cuda::WgmmaGemmSupported(64, 2048, 2080));
  EXPECT_FALSE(cuda::WgmmaGemmSupported(64, 200, 2048));
  EXPECT_EQ(cuda::LaunchWgmmaGemm(nullptr, nullptr, nullptr, true, 64, 192, 320, 0.f, wws, nullptr,
                                  -1, false, {128, 1}),
            cudaErrorInvalidValue);  // 192 features are not whole 128-wide tiles
  EXPECT_EQ(cuda::LaunchWgmmaGemm(nullptr, nullptr, nullptr, true, 64, 16384, 2048, 0.f, wws,
                                  nullptr, -1, false, {64, 16}),
            cudaErrorInvalidValue);  // 4,096 partial tiles: more than the workspace holds
  EXPECT_EQ(cuda::LaunchWgmmaGemm(nullptr, nullptr, nullptr, false, 64, 2048, 2048, 0.f, wws,
                                  nullptr, -1, true),
            cudaErrorInvalidValue);  // planes are fp32
}

// The prompt-step GEMM against the CPU Linear (bf16 out; fp32 added into y)
// and against Linear then the CPU GatedActivation (the gated form): token counts that leave
// the last 128-row tile part empty, feature tiles past one raster band
// (2,560 = 10 tiles), K ending mid-way through the stage ring, and grids of
// a few blocks so that each block takes several tiles. The row after the
// last is poisoned and must stay so; two launches give the same bits.
TEST(CudaKernels, PromptGemmMatchesLinear) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(21);
  struct Case {
    int m, n, k, grid, act;  // act < 0: plain
  };
  const std::vector<Case> cases = {{300, 2560, 320, 7, -1},    {129, 512, 64, sms, -1},
                                   {1000, 768, 1024, sms, -1}, {1, 256, 128, 1, -1},
                                   {300, 2560, 320, 7, 0},     {129, 512, 448, 3, 1},
                                   {1000, 1024, 1024, sms, 0}};
  for (const Case& c : cases) {
    const int m = c.m, n = c.n, k = c.k;
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                             " grid " + std::to_string(c.grid) + " act " + std::to_string(c.act);
    ASSERT_TRUE(cuda::PromptGemmSupported(m, n, k)) << what;
    const auto x = Rounded(Random(static_cast<size_t>(m) * k, rng));
    const auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    const int out_n = c.act >= 0 ? n / 2 : n;
    std::vector<float> ref(static_cast<size_t>(m) * out_n);
    std::vector<uint16_t> wdev;
    if (c.act >= 0) {
      std::vector<float> gu(static_cast<size_t>(m) * n);
      kernels::Linear(x.data(), w.data(), nullptr, gu.data(), m, n, k);  // [gate | up] rows
      kernels::GatedActivation(gu.data(), ref.data(), m, n / 2,
                               c.act == 0 ? Activation::kSilu : Activation::kGeluTanh);
      wdev = Bf16Of(InterleaveGateUp(w, n / 2, k));
    } else {
      kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
      wdev = Bf16Of(w);
    }
    auto dx = Upload(Bf16Of(x)), dw = Upload(wdev);
    std::vector<uint16_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      auto out = Poisoned<uint16_t>(static_cast<size_t>(m + 1) * out_n);
      ASSERT_EQ(cuda::LaunchPromptGemm(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(),
                                       out.get<cuda::bf16_t>(), m, n, k, c.act, c.grid, nullptr),
                cudaSuccess)
          << what;
      const auto raw = Download<uint16_t>(out, static_cast<size_t>(m + 1) * out_n);
      EXPECT_EQ(std::count(raw.begin() + static_cast<size_t>(m) * out_n, raw.end(), 0xffff), out_n)
          << what << ": wrote past row m";
      std::vector<float> got(static_cast<size_t>(m) * out_n);
      for (size_t i = 0; i < got.size(); ++i) got[i] = FromBf16(raw[i]);
      EXPECT_LT(RelErr(got, ref), 1e-2) << what;
      if (rep == 0) {
        first = raw;
      } else {
        EXPECT_EQ(raw, first) << what;
      }
    }
  }
  // The residual form: y += x . w^T in fp32 (one add an element), rows
  // past m left as they were.
  for (auto [m, n, k, grid] : {std::array{300, 2560, 320, 7}, std::array{129, 512, 1024, sms},
                               std::array{1, 256, 64, 1}}) {
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                             " grid " + std::to_string(grid) + " add";
    const auto x = Rounded(Random(static_cast<size_t>(m) * k, rng));
    const auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    auto y0 = Random(static_cast<size_t>(m + 1) * n, rng);
    std::fill(y0.begin() + static_cast<size_t>(m) * n, y0.end(), 12345.f);
    std::vector<float> ref(static_cast<size_t>(m) * n);
    kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
    std::vector<float> first;
    for (int rep = 0; rep < 2; ++rep) {
      auto dy = Upload(y0);
      ASSERT_EQ(cuda::LaunchPromptGemmAdd(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(),
                                          dy.get<float>(), m, n, k, grid, nullptr),
                cudaSuccess)
          << what;
      auto got = Download<float>(dy, static_cast<size_t>(m + 1) * n);
      EXPECT_EQ(std::count(got.begin() + static_cast<size_t>(m) * n, got.end(), 12345.f), n)
          << what << ": wrote past row m";
      got.resize(static_cast<size_t>(m) * n);
      EXPECT_LT(RelErr(got, ref), 1e-5) << what;
      if (rep == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << what;
      }
    }
  }
  EXPECT_FALSE(cuda::PromptGemmSupported(128, 384, 2048));  // not whole 256-feature tiles
  EXPECT_FALSE(cuda::PromptGemmSupported(128, 2048, 2080));
  EXPECT_EQ(cuda::LaunchPromptGemm(nullptr, nullptr, nullptr, 128, 384, 2048, -1, sms, nullptr),
            cudaErrorInvalidValue);
}

// The prompt GEMM's LM head form: its logits against the CPU Linear, its
// argmax the same index as LaunchArgmax over those logits (exact), with
// tied features (duplicate weight rows) in one tile and across tiles going
// to the lower index; with the device flag at 0 no logit is written.
TEST(CudaKernels, PromptGemmArgmaxMatchesArgmaxOfLogits) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(23);
  for (auto [m, n, k, grid] :
       {std::array{64, 2560, 256, sms}, std::array{130, 1024, 128, 5}, std::array{3, 512, 64, 2}}) {
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k);
    const auto x = Rounded(Random(static_cast<size_t>(m) * k, rng));
    auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    for (auto [dst, src] : {std::pair{11, 10}, std::pair{n - 1, 3}})  // ties
      std::copy_n(w.begin() + static_cast<size_t>(src) * k, k,
                  w.begin() + static_cast<size_t>(dst) * k);
    std::vector<float> ref(static_cast<size_t>(m) * n);
    kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
    cuda::DeviceBuffer scratch, scratch2;
    ASSERT_TRUE(scratch.Allocate(cuda::PromptArgmaxScratchBytes(m, n)).ok());
    ASSERT_TRUE(scratch2.Allocate(cuda::ArgmaxScratchBytes(m)).ok());
    auto picks = Poisoned<int32_t>(m), plain = Poisoned<int32_t>(m);
    auto y = Poisoned<float>(static_cast<size_t>(m) * n);
    ASSERT_EQ(cuda::LaunchPromptGemmArgmax(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(),
                                           y.get<float>(), nullptr, m, n, k, scratch.get(),
                                           picks.get<int32_t>(), grid, nullptr),
              cudaSuccess)
        << what;
    EXPECT_LT(RelErr(Download<float>(y, ref.size()), ref), 1e-5) << what;
    ASSERT_EQ(
        cuda::LaunchArgmax(y.get<float>(), m, n, plain.get<int32_t>(), scratch2.get(), nullptr),
        cudaSuccess);
    const auto got = Download<int32_t>(picks, m);
    EXPECT_EQ(got, Download<int32_t>(plain, m)) << what;
    // A row whose best is a tied pair picks the lower index.
    for (int r = 0; r < m; ++r) {
      EXPECT_NE(got[r], 11) << what;
      EXPECT_NE(got[r], n - 1) << what;
    }
    // Flag 0: the same picks, the logits not touched.
    auto flag = Upload(std::vector<int32_t>{0});
    auto y2 = Poisoned<float>(static_cast<size_t>(m) * n);
    auto picks2 = Poisoned<int32_t>(m);
    ASSERT_EQ(cuda::LaunchPromptGemmArgmax(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(),
                                           y2.get<float>(), flag.get<int32_t>(), m, n, k,
                                           scratch.get(), picks2.get<int32_t>(), grid, nullptr),
              cudaSuccess)
        << what;
    EXPECT_EQ(Download<int32_t>(picks2, m), got) << what;
    const auto raw = Download<uint32_t>(y2, static_cast<size_t>(m) * n);
    EXPECT_EQ(std::count(raw.begin(), raw.end(), 0xffffffffu), static_cast<long>(raw.size()))
        << what << ": logits written with the flag at 0";
  }
}

// The LM head's warpgroup GEMM with the argmax in its epilogue: the same
// index as LaunchArgmax over the logits (exact), ties across and within
// tiles going to the lower index, rows past m ignored; the logits stored
// (the same bits as the plain GEMM) when the device flag is 1 or absent, and
// not touched when it is 0.
TEST(CudaKernels, WgmmaGemmArgmaxMatchesArgmaxOfLogits) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(21);
  auto ws = Poisoned<float>(cuda::WgmmaGemmWorkspaceBytes(sms) / 4);
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.bytes()), cudaSuccess);
  struct Case {
    int m, n, k;
    cuda::WgmmaGemmPlan plan;
  };
  for (const Case& c : {Case{64, 64 * 37, 256, {}}, Case{17, 128 * 19, 512, {128, 1, true}},
                        Case{3, 64 * 40, 128, {64, 1}}}) {
    const int m = c.m, n = c.n, k = c.k;
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k);
    const auto x = Rounded(Random(m * k, rng));
    auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    // Row 0's best twice, in different tiles (100 and n - 5); row 1's
    // twice in one tile (5 and 40): the lower index must win.
    auto align = [&](int row, int feature) {
      for (int i = 0; i < k; ++i)
        w[static_cast<size_t>(feature) * k + i] = x[row * k + i] > 0 ? 0.5f : -0.5f;
    };
    align(0, 100);
    align(0, n - 5);
    align(1, 5);
    align(1, 40);
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
    cuda::DeviceBuffer scratch, ref_scratch, flag;
    ASSERT_TRUE(scratch.Allocate(cuda::WgmmaArgmaxScratchBytes(m, n, c.plan)).ok());
    ASSERT_TRUE(ref_scratch.Allocate(cuda::ArgmaxScratchBytes(m)).ok());
    ASSERT_TRUE(flag.Allocate(4).ok());
    // The plain GEMM's logits and their two-pass argmax: the reference.
    auto plain = Poisoned<float>(static_cast<size_t>(m) * n);
    auto ref_picks = Poisoned<int32_t>(m);
    ASSERT_EQ(
        cuda::LaunchWgmmaGemm(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(), plain.get(), true, m,
                              n, k, 0.f, {ws.get(), sms}, nullptr, -1, false, c.plan),
        cudaSuccess);
    ASSERT_EQ(cuda::LaunchArgmax(plain.get<float>(), m, n, ref_picks.get<int32_t>(),
                                 ref_scratch.get(), nullptr),
              cudaSuccess);
    const auto want_logits = Download<float>(plain, static_cast<size_t>(m) * n);
    const auto want = Download<int32_t>(ref_picks, m);
    EXPECT_EQ(want[0], 100) << what;
    EXPECT_EQ(want[1], 5) << what;
    for (int store : {1, 0, -1}) {  // -1: no flag (always stored)
      const int32_t v = store;
      ASSERT_EQ(cudaMemcpy(flag.get(), &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
      auto logits = Poisoned<float>(static_cast<size_t>(m) * n);
      auto picks = Poisoned<int32_t>(m);
      ASSERT_EQ(cuda::LaunchWgmmaGemmArgmax(
                    dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(), logits.get<float>(),
                    store < 0 ? nullptr : flag.get<int32_t>(), m, n, k, scratch.get(),
                    picks.get<int32_t>(), sms, nullptr, c.plan),
                cudaSuccess)
          << what;
      EXPECT_EQ(Download<int32_t>(picks, m), want) << what << " store " << store;
      const auto got = Download<float>(logits, static_cast<size_t>(m) * n);
      if (store != 0) {
        EXPECT_EQ(0, std::memcmp(got.data(), want_logits.data(), got.size() * 4)) << what;
      } else {
        EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float f) { return std::isnan(f); }))
            << what << ": logits written although the flag was 0";
      }
    }
  }
  cuda::DeviceBuffer any;
  ASSERT_TRUE(any.Allocate(1 << 20).ok());
  EXPECT_EQ(cuda::LaunchWgmmaGemmArgmax(nullptr, nullptr, nullptr, nullptr, 64, 2048, 2048,
                                        any.get(), any.get<int32_t>(), sms, nullptr, {64, 2}),
            cudaErrorInvalidValue);  // no split K
  EXPECT_EQ(cuda::LaunchWgmmaGemmArgmax(nullptr, nullptr, nullptr, nullptr, 64, 2048, 2048, nullptr,
                                        any.get<int32_t>(), sms, nullptr),
            cudaErrorInvalidValue);  // no scratch
}

// The split-K planes of the warpgroup GEMM added to the residual by the
// norm kernel: x + x . w^T written back (fp32, against the CPU Linear) and
// its RMSNorm (bf16, against the CPU RmsNorm of that sum), for all rows and
// for a gather of rows (the LM head's); the same bits on a second run.
TEST(CudaKernels, WgmmaPlanesAddedByNormMatchLinearThenRmsNorm) {
  AGENTKV_REQUIRE_GPU();
  const int sms = Cc90Sms();
  if (sms == 0) GTEST_SKIP() << "needs compute capability 9.0";
  std::mt19937 rng(14);
  const cuda::WgmmaGemmWorkspace none{nullptr, sms};  // planes need no workspace
  // (Rows of up to one float4 per thread stay in registers; 4,096 takes the
  // other path.)
  for (auto [m, n, k, splits] :
       {std::array{40, 2048, 8192, 0}, std::array{64, 2048, 2048, 0}, std::array{9, 512, 1024, 3},
        std::array{17, 1024, 4096, 16}, std::array{5, 4096, 1024, 4}}) {
    cuda::WgmmaGemmPlan plan = cuda::WgmmaGemmPlanFor(n, k, sms);
    if (splits > 0) plan.splits = splits;
    ASSERT_TRUE(cuda::AddPartsRmsNormSupported(n, plan.splits));
    const auto x = Rounded(Random(m * k, rng)),
               w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    const auto res = Random(m * n, rng), nw = Random(n, rng, 0.2f, 1.f);
    std::vector<float> sum(m * n), normed(m * n);
    kernels::Linear(x.data(), w.data(), nullptr, sum.data(), m, n, k);
    for (int i = 0; i < m * n; ++i) sum[i] += res[i];
    kernels::RmsNorm(sum.data(), nw.data(), normed.data(), m, n, 1e-6f, false);
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w)), dnw = Upload(nw);
    auto planes = Poisoned<float>(static_cast<size_t>(plan.splits) * m * n);
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                             " splits " + std::to_string(plan.splits);
    std::vector<float> first;
    for (int rep = 0; rep < 2; ++rep) {
      auto dres = Upload(res);
      auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
      ASSERT_EQ(cuda::LaunchWgmmaGemm(dx.get<cuda::bf16_t>(), dw.get<cuda::bf16_t>(), planes.get(),
                                      true, m, n, k, 0.f, none, nullptr, -1, true, plan),
                cudaSuccess)
          << what;
      ASSERT_EQ(cuda::LaunchAddPartsRmsNorm(dres.get<float>(), planes.get<float>(), plan.splits,
                                            static_cast<int64_t>(m) * n, nullptr, dnw.get<float>(),
                                            out.get<cuda::bf16_t>(), m, n, 1e-6f, false, nullptr),
                cudaSuccess)
          << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      const auto got = Download<float>(dres, m * n);
      EXPECT_LT(RelErr(got, sum), 1e-5) << what;
      EXPECT_LT(RelErr(DownloadBf16(out, m * n), normed), 1e-2) << what;
      if (rep == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << what;
      }
    }
    // A gather of rows (last, first): only they are added and normalised.
    auto dres = Upload(res);
    auto rows = Upload(std::vector<int32_t>{m - 1, 0});
    auto out = Poisoned<uint16_t>(2 * static_cast<size_t>(n));
    ASSERT_EQ(cuda::LaunchAddPartsRmsNorm(dres.get<float>(), planes.get<float>(), plan.splits,
                                          static_cast<int64_t>(m) * n, rows.get<int32_t>(),
                                          dnw.get<float>(), out.get<cuda::bf16_t>(), 2, n, 1e-6f,
                                          false, nullptr),
              cudaSuccess);
    std::vector<float> want(normed.end() - n, normed.end());
    want.insert(want.end(), normed.begin(), normed.begin() + n);
    EXPECT_LT(RelErr(DownloadBf16(out, 2 * n), want), 1e-2) << what;
  }
  EXPECT_FALSE(cuda::AddPartsRmsNormSupported(2048, cuda::kMaxWgmmaSplits + 1));
  EXPECT_FALSE(cuda::AddPartsRmsNormSupported(2050, 2));
}

// The MLP's norm, gate_up GEMV and activation in one (pipelined) kernel
// against the CPU RmsNorm, Linear and GatedActivation; shapes whose rows
// leave warps idle (74 pairs) and end in a partial stage (k = 2,312).
TEST(CudaKernels, NormGemvGatedActMatchesNormLinearActivation) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(13);
  for (int m = 1; m <= cuda::kMaxNormGemvRows; ++m)
    for (auto [n, k] : {std::pair{8192, 2048}, std::pair{1000, 4096}, std::pair{74, 2312}})
      for (bool plus_one : {false, true}) {
        const Activation a = plus_one ? Activation::kGeluTanh : Activation::kSilu;
        ASSERT_TRUE(cuda::NormGemvGatedActSupported(m, 2 * n, k));
        const auto x = Random(m * k, rng, 2.f);
        const auto nw = Random(k, rng, 0.2f, plus_one ? 0.f : 1.f);
        const auto w = Rounded(Random(static_cast<size_t>(2 * n) * k, rng, 0.05f));
        auto dx = Upload(x), dnw = Upload(nw), dw = Upload(Bf16Of(InterleaveGateUp(w, n, k)));
        auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
        ASSERT_EQ(cuda::LaunchNormGemvGatedAct(dx.get<float>(), dnw.get<float>(), 1e-6f, plus_one,
                                               dw.get<cuda::bf16_t>(), out.get<cuda::bf16_t>(), m,
                                               2 * n, k, a == Activation::kSilu ? 0 : 1, nullptr),
                  cudaSuccess);
        std::vector<float> h(m * k);
        kernels::RmsNorm(x.data(), nw.data(), h.data(), m, k, 1e-6f, plus_one);
        h = Rounded(h);  // the GEMV reads the normalised rows as bf16
        ExpectLinearThenGated(out, h, w, m, n, k, a);
      }
  EXPECT_FALSE(cuda::NormGemvGatedActSupported(cuda::kMaxNormGemvRows + 1, 16384, 2048));
  EXPECT_FALSE(cuda::NormGemvGatedActSupported(1, 1001, 2048));   // odd: not whole pairs
  EXPECT_FALSE(cuda::NormGemvGatedActSupported(1, 16384, 8192));  // x in registers: k <= 4096
}

// RMSNorm of fp32 rows fused into the GEMV: the same as RmsNorm (bf16
// output) followed by Linear, for rows split over 1, 2 and 4 warps.
TEST(CudaKernels, NormGemvMatchesNormThenLinear) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(9);
  for (int m = 1; m <= cuda::kMaxNormGemvRows; ++m) {
    for (auto [n, k] :
         {std::pair{3072, 2048}, std::pair{1000, 4096}, std::pair{512, 2560}, std::pair{37, 264}}) {
      for (bool plus_one : {false, true}) {
        const auto x = Random(m * k, rng, 2.f);
        const auto nw = Random(k, rng, 0.2f, plus_one ? 0.f : 1.f);
        const auto w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
        auto dx = Upload(x), dnw = Upload(nw), dw = Upload(Bf16Of(w));
        auto dy = Poisoned<float>(m * n);
        ASSERT_EQ(
            cuda::LaunchNormGemv(dx.get<float>(), dnw.get<float>(), 1e-6f, plus_one,
                                 dw.get<cuda::bf16_t>(), dy.get(), true, m, n, k, 0.f, nullptr),
            cudaSuccess);
        std::vector<float> h(m * k), ref(m * n);
        kernels::RmsNorm(x.data(), nw.data(), h.data(), m, k, 1e-6f, plus_one);
        h = Rounded(h);  // the GEMV reads the normalised rows as bf16
        kernels::Linear(h.data(), w.data(), nullptr, ref.data(), m, n, k);
        EXPECT_LT(RelErr(Download<float>(dy, m * n), ref), 5e-3) << m << " " << n << " " << k;
      }
    }
  }
  EXPECT_FALSE(cuda::NormGemvSupported(cuda::kMaxNormGemvRows + 1, 2048));
  EXPECT_FALSE(cuda::NormGemvSupported(1, 8192));  // x is held in registers: K <= 4096
}

TEST(CudaKernels, ArgmaxTiesAndNaN) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int cols = 151936;
  std::vector<float> x = Random(4 * cols, rng);
  x[0 * cols + 777] = 50.f;
  x[0 * cols + 90000] = 50.f;  // tie: the lower id wins
  x[1 * cols + 5] = NAN;
  x[1 * cols + 100000] = 60.f;
  std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, -INFINITY);  // nothing beats -inf: 0
  auto d = Upload(x);
  auto out = Poisoned<int32_t>(4);
  cuda::DeviceBuffer scratch;
  ASSERT_TRUE(scratch.Allocate(cuda::ArgmaxScratchBytes(4)).ok());
  ASSERT_EQ(cuda::LaunchArgmax(d.get<float>(), 4, cols, out.get<int32_t>(), scratch.get(), nullptr),
            cudaSuccess);
  auto got = Download<int32_t>(out, 4);
  int32_t best3 = 0;
  for (int i = 1; i < cols; ++i)
    if (x[3 * cols + i] > x[3 * cols + best3]) best3 = i;
  EXPECT_EQ(got[0], 777);
  EXPECT_EQ(got[1], 100000);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(got[3], best3);
}

// H 96 and 2,064 take the vector path (more chunks than threads at 2,064),
// 98 the element loop.
TEST(CudaKernels, EmbedAndSoftcap) {
  AGENTKV_REQUIRE_GPU();
  for (const int H : {96, 2064, 98}) {
    SCOPED_TRACE(H);
    std::mt19937 rng(6);
    const int V = 50;
    auto table = Rounded(Random(V * H, rng));
    // -1 - r: the r-th pick of the previous step (here 49, then 0).
    std::vector<int32_t> toks = {3, -2, -1, 3}, picks = {0, 49};
    auto dt = Upload(Bf16Of(table)), dk = Upload(toks), dp = Upload(picks);
    for (int32_t& t : toks)
      if (t < 0) t = picks[-1 - t];
    auto x = Poisoned<float>(toks.size() * H);
    ASSERT_EQ(cuda::LaunchEmbed(dt.get<cuda::bf16_t>(), dk.get<int32_t>(), dp.get<int32_t>(), 4, H,
                                2.5f, x.get<float>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchSoftcap(x.get<float>(), 4 * H, 3.f, nullptr), cudaSuccess);
    auto got = Download<float>(x, 4 * H);
    for (int t = 0; t < 4; ++t)
      for (int d = 0; d < H; ++d)
        EXPECT_NEAR(got[t * H + d], 3.f * std::tanh(table[toks[t] * H + d] * 2.5f / 3.f), 1e-5f);
  }
}

// Paged attention against AttendOne over the same bf16 values: sequences
// mixing a long prefill chunk, chunks continuing cached context and decode
// tokens; full attention and sliding rings; with and without key splits;
// narrow (decode) and wide (prefill) tiles.
struct AttnCase {
  int head_dim, nh, nkv, window, splits;
  bool wide = false;
};

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpuReference) {
  AGENTKV_REQUIRE_GPU();
  const AttnCase pc = GetParam();
  const int D = pc.head_dim, nh = pc.nh, nkv = pc.nkv, G = nh / nkv, bs = 16;
  std::mt19937 rng(7 + D + pc.window + pc.splits);
  struct Seq {
    int start, n;
  };
  const std::vector<Seq> seqs = {{0, 37}, {100, 1}, {50, 9}, {530, 1}, {0, 1}, {200, 70}};
  const int ring = pc.window > 0 ? (pc.window + bs - 1) / bs + 1 : 0;
  // Block tables: distinct shuffled block ids per sequence.
  int width = 0;
  for (const Seq& s : seqs) width = std::max(width, (s.start + s.n + bs - 1) / bs);
  if (ring) width = std::min(width, ring);
  const int B = static_cast<int>(seqs.size());
  std::vector<int32_t> ids(B * width);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int num_blocks = B * width;
  const int64_t row = static_cast<int64_t>(nkv) * D;
  const int64_t block_stride = 2 * bs * row;  // one layer in the group
  std::vector<uint16_t> cache(num_blocks * block_stride, ToBf16(NAN));
  // Every position's K and V (cached ones and this step's), bf16-exact.
  std::vector<std::vector<float>> keys(B), vals(B);
  int T = 0;
  for (int s = 0; s < B; ++s) {
    const int end = seqs[s].start + seqs[s].n;
    keys[s] = Rounded(Random(static_cast<size_t>(end) * row, rng));
    vals[s] = Rounded(Random(static_cast<size_t>(end) * row, rng));
    for (int p = 0; p < seqs[s].start; ++p) {  // in order: rings keep the newest
      const int lb = p / bs;
      const int blk = ids[s * width + (ring ? lb % ring : lb)];
      for (int i = 0; i < row; ++i) {
        cache[blk * block_stride + (p % bs) * row + i] = ToBf16(keys[s][p * row + i]);
        cache[blk * block_stride + (bs + p % bs) * row + i] = ToBf16(vals[s][p * row + i]);
      }
    }
    T += seqs[s].n;
  }
  std::vector<float> q = Rounded(Random(static_cast<size_t>(T) * nh * D, rng));
  std::vector<uint16_t> knew(T * row), vnew(T * row);
  std::vector<int32_t> pos(T), seq_start(B), seq_first(B), tile_seq, tile_t0, tile_n;
  const int tpt = cuda::TokensPerTile(G, pc.wide);
  int t = 0;
  for (int s = 0; s < B; ++s) {
    seq_start[s] = seqs[s].start;
    seq_first[s] = t;
    for (int i = 0; i < seqs[s].n; i += tpt) {
      tile_seq.push_back(s);
      tile_t0.push_back(t + i);
      tile_n.push_back(std::min(tpt, seqs[s].n - i));
    }
    for (int i = 0; i < seqs[s].n; ++i, ++t) {
      pos[t] = seqs[s].start + i;
      for (int j = 0; j < row; ++j) {
        knew[t * row + j] = ToBf16(keys[s][pos[t] * row + j]);
        vnew[t * row + j] = ToBf16(vals[s][pos[t] * row + j]);
      }
    }
  }
  tile_seq.push_back(0);  // a padding tile
  tile_t0.push_back(0);
  tile_n.push_back(0);
  auto dq = Upload(Bf16Of(q)), dk = Upload(knew), dv = Upload(vnew), dc = Upload(cache),
       dtab = Upload(ids), dpos = Upload(pos), dss = Upload(seq_start), dsf = Upload(seq_first),
       dts = Upload(tile_seq), dt0 = Upload(tile_t0), dtn = Upload(tile_n),
       dwidth = Upload(std::vector<int32_t>{width});
  auto part_o = Poisoned<float>(static_cast<size_t>(T) * nh * pc.splits * D);
  auto part_ml = Poisoned<float>(static_cast<size_t>(T) * nh * pc.splits * 2);
  auto out = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
  cuda::AttentionParams p;
  p.q = dq.get<cuda::bf16_t>();
  p.k_new = dk.get<cuda::bf16_t>();
  p.v_new = dv.get<cuda::bf16_t>();
  p.cache.base = dc.get<cuda::bf16_t>();
  p.cache.block_stride = block_stride;
  p.cache.layer_offset = 0;
  p.cache.block_size = bs;
  p.cache.ring = ring;
  p.cache.tables = dtab.get<int32_t>();
  p.cache.table_stride = dwidth.get<int32_t>();
  SetStep(p, dpos, dss, dsf, {&dts, &dt0, &dtn}, static_cast<int>(tile_n.size()), T, nh, nkv, D);
  p.window = pc.window;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  p.softcap = pc.window == 7 ? 30.f : 0.f;
  p.splits = pc.splits;
  p.wide = pc.wide;
  p.part_o = part_o.get<float>();
  p.part_ml = part_ml.get<float>();
  p.out = out.get<cuda::bf16_t>();
  ASSERT_EQ(cuda::LaunchAttention(p, nullptr), cudaSuccess);
  std::vector<float> got = DownloadBf16(out, static_cast<size_t>(T) * nh * D);

  std::vector<float> ref(static_cast<size_t>(T) * nh * D), scores(4096);
  t = 0;
  for (int s = 0; s < B; ++s) {
    for (int i = 0; i < seqs[s].n; ++i, ++t) {
      const int ps = pos[t];
      const int lo = pc.window > 0 ? std::max(0, ps - pc.window + 1) : 0;
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / G;
        kernels::AttendOne(
            q.data() + (static_cast<int64_t>(t) * nh + h) * D, ps - lo + 1, D, p.scale, p.softcap,
            [&](int j) { return keys[s].data() + (lo + j) * row + kvh * D; },
            [&](int j) { return vals[s].data() + (lo + j) * row + kvh * D; }, scores.data(),
            ref.data() + (static_cast<int64_t>(t) * nh + h) * D);
      }
    }
  }
  EXPECT_LT(RelErr(got, ref), 2e-2);
  // The kernels CudaTuning's switches fall back on (AttentionParams::mma and
  // wgmma off): narrow tiles on the portable kernel, wide ones on the
  // mma.sync kernel.
  {
    cuda::AttentionParams plain = p;
    plain.mma = plain.wgmma = false;
    auto out_plain = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
    plain.out = out_plain.get<cuda::bf16_t>();
    ASSERT_EQ(cuda::LaunchAttention(plain, nullptr), cudaSuccess);
    EXPECT_LT(RelErr(DownloadBf16(out_plain, static_cast<size_t>(T) * nh * D), ref), 2e-2)
        << "mma and wgmma off";
  }
  // The warpgroup kernel's page copies (AttentionParams::kv_map): the same
  // step with its own keys in the cache as well, as LaunchQkvPostStore
  // leaves a prompt step's. The rows past each sequence stay NaN: the
  // kernel must not let them into the output.
  alignas(64) unsigned char map[cuda::kKvTensorMapBytes];
  if (pc.wide && pc.window == 0 && cuda::WgmmaAttentionSupported(D)) {
    ASSERT_TRUE(cuda::EncodeKvTensorMap(dc.get<cuda::bf16_t>(), num_blocks, block_stride, 1, bs,
                                        nkv, D, map));
    for (int s = 0; s < B; ++s)
      for (int ps = seqs[s].start; ps < seqs[s].start + seqs[s].n; ++ps) {
        const int blk = ids[s * width + ps / bs];
        for (int i = 0; i < row; ++i) {
          cache[blk * block_stride + (ps % bs) * row + i] = ToBf16(keys[s][ps * row + i]);
          cache[blk * block_stride + (bs + ps % bs) * row + i] = ToBf16(vals[s][ps * row + i]);
        }
      }
    auto dc2 = Upload(cache);
    auto dmap = Upload(std::vector<unsigned char>(map, map + sizeof(map)));
    auto out2 = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
    // The map names the first upload's blocks: copy the new contents there.
    ASSERT_EQ(cudaMemcpy(dc.get(), dc2.get(), cache.size() * 2, cudaMemcpyDeviceToDevice),
              cudaSuccess);
    p.kv_map = dmap.get();
    p.out = out2.get<cuda::bf16_t>();
    ASSERT_EQ(cuda::LaunchAttention(p, nullptr), cudaSuccess);
    EXPECT_LT(RelErr(DownloadBf16(out2, static_cast<size_t>(T) * nh * D), ref), 2e-2)
        << "with kv_map";
  }
  // On failure, which sequences (and so which key spans) are off.
  if (RelErr(got, ref) >= 2e-2) {
    t = 0;
    for (int s = 0; s < B; ++s) {
      const size_t at = static_cast<size_t>(t) * nh * D,
                   len = static_cast<size_t>(seqs[s].n) * nh * D;
      std::vector<float> g(got.begin() + at, got.begin() + at + len),
          r(ref.begin() + at, ref.begin() + at + len);
      ADD_FAILURE() << "sequence " << s << " (start " << seqs[s].start << ", " << seqs[s].n
                    << " tokens): rel err " << RelErr(g, r);
      t += seqs[s].n;
    }
  }
}

std::vector<AttnCase> AttnCases() {
  const std::vector<AttnCase> shapes = {{64, 32, 8, 0, 1},
                                        {64, 32, 8, 0, 7},
                                        {128, 32, 8, 0, 1},
                                        {128, 32, 8, 0, 4},
                                        {16, 4, 2, 7, 1},
                                        {16, 4, 2, 7, 3},
                                        {256, 8, 2, 40, 1},
                                        {256, 8, 2, 40, 5},
                                        {32, 4, 1, 0, 2},
                                        {128, 7, 1, 0, 1},
                                        {64, 16, 1, 0, 3},
                                        // The tensor-core kernels' masked stages
                                        // with a window, and with a softcap.
                                        {64, 32, 8, 40, 2},
                                        {64, 8, 2, 7, 1}};
  std::vector<AttnCase> all;
  for (bool wide : {false, true})
    for (AttnCase c : shapes) {
      if (wide && !cuda::WideAttentionSupported(c.head_dim)) continue;
      c.wide = wide;
      all.push_back(c);
    }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(AttnCases()),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return "D" + std::to_string(c.head_dim) + "_h" + std::to_string(c.nh) +
                                  "_kv" + std::to_string(c.nkv) + "_w" + std::to_string(c.window) +
                                  "_s" + std::to_string(c.splits) + (c.wide ? "_wide" : "");
                         });

// Decode attention given the projection (AttentionParams::qkv) against the
// two-kernel path it replaces (LaunchQkvPostStore, then attention on q, k,
// v): the same outputs and the same K/V rows left in the cache. Both paths
// are checked against the CPU references above. The projection given as
// planes to add gives the same bits.
TEST(CudaKernels, FusedRotaryAttentionMatchesQkvPostThenAttention) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(21);
  struct Case {
    int D, nh, nkv, splits;
    bool bias, norm;
  };
  for (Case cs : {Case{64, 32, 8, 1, false, false}, Case{64, 32, 8, 4, true, false},
                  Case{128, 16, 8, 3, false, true}, Case{128, 8, 4, 1, true, true}}) {
    if (!cuda::FusedRotarySupported(cs.D)) continue;
    const int D = cs.D, nh = cs.nh, nkv = cs.nkv, heads = nh + 2 * nkv, G = nh / nkv;
    const int bs = 16, width = 8, nblocks = 40, row = nkv * D;
    const std::vector<int> starts = {5, 40, 100, 0};  // one decode token each
    const int B = static_cast<int>(starts.size()), T = B;
    RopeSpec rope;
    rope.theta = 10000.f;
    const auto inv = kernels::RopeInvFreq(rope, D);
    const auto qkv = Random(static_cast<size_t>(T) * heads * D, rng);
    const auto bias = Random(static_cast<size_t>(heads) * D, rng, 0.5f);
    const auto qn = Random(D, rng, 0.2f, 1.f), kn = Random(D, rng, 0.2f, 1.f);
    const int64_t block_stride = 2LL * bs * row;
    std::vector<uint16_t> cache0 = Bf16Of(Random(static_cast<size_t>(nblocks) * block_stride, rng));
    std::vector<int32_t> ids(B * width), pos(T), seq_start(B), seq_first(B + 1), tile_seq(T),
        tile_t0(T), tile_n(T, 1), tok_seq(T);
    std::vector<int> perm(nblocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < B * width; ++i) ids[i] = perm[i];
    for (int t = 0; t < T; ++t) {
      pos[t] = seq_start[t] = starts[t];
      seq_first[t] = tile_t0[t] = t;
      tile_seq[t] = tok_seq[t] = t;
    }
    seq_first[B] = T;
    auto dqkv = Upload(qkv), dbias = Upload(bias), dqn = Upload(qn), dkn = Upload(kn),
         dinv = Upload(inv), dtab = Upload(ids), dpos = Upload(pos), dss = Upload(seq_start),
         dsf = Upload(seq_first), dts = Upload(tile_seq), dt0 = Upload(tile_t0),
         dtn = Upload(tile_n), dtok = Upload(tok_seq), dwidth = Upload(std::vector<int32_t>{width});
    auto q = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
    auto k = Poisoned<uint16_t>(static_cast<size_t>(T) * row);
    auto v = Poisoned<uint16_t>(static_cast<size_t>(T) * row);
    auto part_o = Poisoned<float>(static_cast<size_t>(T) * nh * cs.splits * D);
    auto part_ml = Poisoned<float>(static_cast<size_t>(T) * nh * cs.splits * 2);
    // The projection also as three planes (half, half, zero: their sum is
    // exact), as a split-K GEMM leaves it.
    std::vector<float> planes(3 * qkv.size(), 0.f);
    for (size_t i = 0; i < qkv.size(); ++i) planes[i] = planes[qkv.size() + i] = qkv[i] / 2;
    auto dplanes = Upload(planes);
    std::vector<std::vector<float>> outs, caches;
    for (int mode = 0; mode < 3; ++mode) {
      const bool fused = mode > 0;
      auto dc = Upload(cache0);
      cuda::KvCacheView view;
      view.base = dc.get<cuda::bf16_t>();
      view.block_stride = block_stride;
      view.block_size = bs;
      view.tables = dtab.get<int32_t>();
      view.table_stride = dwidth.get<int32_t>();
      const float* b = cs.bias ? dbias.get<float>() : nullptr;
      const float* qnp = cs.norm ? dqn.get<float>() : nullptr;
      const float* knp = cs.norm ? dkn.get<float>() : nullptr;
      cuda::AttentionParams p;
      if (!fused) {
        ASSERT_EQ(cuda::LaunchQkvPostStore(
                      dqkv.get<float>(), b, qnp, knp, dinv.get<float>(), dpos.get<int32_t>(),
                      dtok.get<int32_t>(), T, nh, nkv, D, 1e-6f, false, q.get<cuda::bf16_t>(),
                      k.get<cuda::bf16_t>(), v.get<cuda::bf16_t>(), view, nullptr),
                  cudaSuccess);
        p.q = q.get<cuda::bf16_t>();
        p.k_new = k.get<cuda::bf16_t>();
        p.v_new = v.get<cuda::bf16_t>();
      } else {
        p.qkv = mode == 1 ? dqkv.get<float>() : dplanes.get<float>();
        p.qkv_planes = mode == 1 ? 1 : 3;
        p.qkv_plane = static_cast<int64_t>(qkv.size());
        p.bias = b;
        p.q_norm = qnp;
        p.k_norm = knp;
        p.inv_freq = dinv.get<float>();
        p.eps = 1e-6f;
      }
      p.cache = view;
      SetStep(p, dpos, dss, dsf, {&dts, &dt0, &dtn}, T, T, nh, nkv, D);
      p.scale = 1.f / std::sqrt(static_cast<float>(D));
      p.splits = cs.splits;
      p.part_o = part_o.get<float>();
      p.part_ml = part_ml.get<float>();
      auto out = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
      p.out = out.get<cuda::bf16_t>();
      ASSERT_EQ(cuda::LaunchAttention(p, nullptr), cudaSuccess);
      outs.push_back(DownloadBf16(out, static_cast<size_t>(T) * nh * D));
      caches.push_back(DownloadBf16(dc, cache0.size()));
    }
    const std::string what =
        "D" + std::to_string(D) + " G" + std::to_string(G) + " splits " + std::to_string(cs.splits);
    EXPECT_LT(RelErr(outs[1], outs[0]), 1e-2) << what;
    EXPECT_LT(RelErr(caches[1], caches[0]), 1e-3) << what;  // one row per token and head
    EXPECT_EQ(outs[2], outs[1]) << what;
    EXPECT_EQ(caches[2], caches[1]) << what;
  }
  cuda::AttentionParams wide;  // the projection is for narrow (decode) tiles only
  wide.qkv = reinterpret_cast<const float*>(&wide);
  wide.num_tiles = 1;
  wide.nh = wide.nkv = 1;
  wide.head_dim = 64;
  wide.wide = true;
  EXPECT_EQ(cuda::LaunchAttention(wide, nullptr), cudaErrorInvalidValue);
  // Nor without the mma.sync kernel (the portable one has no such path).
  cuda::AttentionParams plain = wide;
  plain.wide = false;
  plain.mma = false;
  EXPECT_EQ(cuda::LaunchAttention(plain, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace agentkv

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
