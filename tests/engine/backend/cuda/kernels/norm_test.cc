// The embedding and norm kernels (norm.cu) and the softcap (elementwise.cu)
// against their CPU references (engine/backend/cpu/cpu_kernels.h).
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
#include "engine/backend/cuda/kernels/elementwise.h"
#include "engine/backend/cuda/kernels/norm.h"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

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
        ASSERT_EQ(LaunchRmsNorm(dx.get<float>(), nullptr, dw.get<float>(), out.get<bf16_t>(), rows,
                                dim, 1e-6f, plus_one, nullptr),
                  cudaSuccess);
        std::vector<float> ref(rows * dim);
        cpu::kernels::RmsNorm(x.data(), w.data(), ref.data(), rows, dim, 1e-6f, plus_one);
        EXPECT_LT(RelErr(DownloadBf16(out, rows * dim), ref), 1e-2) << dim << " " << plus_one;
        // Gathered rows (the final norm of the logits rows).
        auto out2 = Poisoned<uint16_t>(3 * dim);
        ASSERT_EQ(LaunchRmsNorm(dx.get<float>(), di.get<int32_t>(), dw.get<float>(),
                                out2.get<bf16_t>(), 3, dim, 1e-6f, plus_one, nullptr),
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
  ASSERT_EQ(LaunchAddNormed(d_o.get<float>(), dw1.get<float>(), dx.get<float>(), dw2.get<float>(),
                            h.get<bf16_t>(), rows, dim, 1e-6f, true, nullptr),
            cudaSuccess);
  std::vector<float> on(rows * dim), hr(rows * dim), xr = x;
  cpu::kernels::RmsNorm(o.data(), w1.data(), on.data(), rows, dim, 1e-6f, true);
  for (size_t i = 0; i < xr.size(); ++i) xr[i] += on[i];
  cpu::kernels::RmsNorm(xr.data(), w2.data(), hr.data(), rows, dim, 1e-6f, true);
  EXPECT_LT(RelErr(Download<float>(dx, rows * dim), xr), 1e-5);
  EXPECT_LT(RelErr(DownloadBf16(h, rows * dim), hr), 1e-2);
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
  const WgmmaGemmWorkspace none{nullptr, sms};  // planes need no workspace
  // (Rows of up to one float4 per thread stay in registers; 4,096 takes the
  // other path.)
  for (auto [m, n, k, splits] :
       {std::array{40, 2048, 8192, 0}, std::array{64, 2048, 2048, 0}, std::array{9, 512, 1024, 3},
        std::array{17, 1024, 4096, 16}, std::array{5, 4096, 1024, 4}}) {
    WgmmaGemmPlan plan = WgmmaGemmPlanFor(n, k, sms);
    if (splits > 0) plan.splits = splits;
    ASSERT_TRUE(AddPartsRmsNormSupported(n, plan.splits));
    const auto x = Rounded(Random(m * k, rng)),
               w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
    const auto res = Random(m * n, rng), nw = Random(n, rng, 0.2f, 1.f);
    std::vector<float> sum(m * n), normed(m * n);
    cpu::kernels::Linear(x.data(), w.data(), nullptr, sum.data(), m, n, k);
    for (int i = 0; i < m * n; ++i) sum[i] += res[i];
    cpu::kernels::RmsNorm(sum.data(), nw.data(), normed.data(), m, n, 1e-6f, false);
    auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w)), dnw = Upload(nw);
    auto planes = Poisoned<float>(static_cast<size_t>(plan.splits) * m * n);
    const std::string what = std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k) +
                             " splits " + std::to_string(plan.splits);
    std::vector<float> first;
    for (int rep = 0; rep < 2; ++rep) {
      auto dres = Upload(res);
      auto out = Poisoned<uint16_t>(static_cast<size_t>(m) * n);
      ASSERT_EQ(LaunchWgmmaGemm(dx.get<bf16_t>(), dw.get<bf16_t>(), planes.get(), true, m, n, k,
                                0.f, none, nullptr, -1, true, plan),
                cudaSuccess)
          << what;
      ASSERT_EQ(LaunchAddPartsRmsNorm(dres.get<float>(), planes.get<float>(), plan.splits,
                                      static_cast<int64_t>(m) * n, nullptr, dnw.get<float>(),
                                      out.get<bf16_t>(), m, n, 1e-6f, false, nullptr),
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
    ASSERT_EQ(
        LaunchAddPartsRmsNorm(dres.get<float>(), planes.get<float>(), plan.splits,
                              static_cast<int64_t>(m) * n, rows.get<int32_t>(), dnw.get<float>(),
                              out.get<bf16_t>(), 2, n, 1e-6f, false, nullptr),
        cudaSuccess);
    std::vector<float> want(normed.end() - n, normed.end());
    want.insert(want.end(), normed.begin(), normed.begin() + n);
    EXPECT_LT(RelErr(DownloadBf16(out, 2 * n), want), 1e-2) << what;
  }
  EXPECT_FALSE(AddPartsRmsNormSupported(2048, kMaxWgmmaSplits + 1));
  EXPECT_FALSE(AddPartsRmsNormSupported(2050, 2));
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
    ASSERT_EQ(LaunchEmbed(dt.get<bf16_t>(), dk.get<int32_t>(), dp.get<int32_t>(), 4, H, 2.5f,
                          x.get<float>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(LaunchSoftcap(x.get<float>(), 4 * H, 3.f, nullptr), cudaSuccess);
    auto got = Download<float>(x, 4 * H);
    for (int t = 0; t < 4; ++t)
      for (int d = 0; d < H; ++d)
        EXPECT_NEAR(got[t * H + d], 3.f * std::tanh(table[toks[t] * H + d] * 2.5f / 3.f), 1e-5f);
  }
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
