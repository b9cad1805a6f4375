// GemmTuner against a CPU reference: whichever algorithm it picks, at an
// anchor and between anchors, bf16 and fp32 outputs, with beta 0 (outputs
// poisoned with NaN first) and 1 (accumulated into known values).
// Tolerance: relative L2 error 1e-5 for fp32 outputs (fp32 accumulation of
// bf16-exact products over k = 512, any order) and 8e-3 for bf16 outputs
// (one rounding to bf16: at most 2^-9 relative per element).
#include "test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <cublas_v2.h>

#include <random>

#include "engine/backend/cuda/gemm_tuner.h"

namespace agentkv::backend::cuda {
namespace {

using namespace agentkv::testing;

struct Gemm {
  int n = 256, k = 512, max_m = 1024;
  std::vector<float> x, w;  // bf16-exact
  cuda::DeviceBuffer dx, dw, dy;
  Gemm() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    x.resize(static_cast<size_t>(max_m) * k);
    w.resize(static_cast<size_t>(n) * k);
    for (float& v : x) v = RoundBf16(u(rng));
    for (float& v : w) v = RoundBf16(u(rng));
    EXPECT_TRUE(Upload(x, &dx).ok());
    EXPECT_TRUE(Upload(w, &dw).ok());
    EXPECT_TRUE(dy.Allocate(static_cast<size_t>(max_m) * n * 4).ok());
  }
  static Status Upload(const std::vector<float>& v, cuda::DeviceBuffer* d) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = ToBf16(v[i]);
    RETURN_IF_ERROR(d->Allocate(b.size() * 2));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(d->get(), b.data(), b.size() * 2, cudaMemcpyHostToDevice));
    return Status::Ok();
  }
  std::vector<float> Reference(int m, float beta, float y0) const {
    std::vector<float> y(static_cast<size_t>(m) * n);
    for (int r = 0; r < m; ++r)
      for (int c = 0; c < n; ++c) {
        double acc = 0;
        for (int i = 0; i < k; ++i)
          acc += static_cast<double>(x[static_cast<size_t>(r) * k + i]) *
                 w[static_cast<size_t>(c) * k + i];
        y[static_cast<size_t>(r) * n + c] = static_cast<float>(acc + beta * y0);
      }
    return y;
  }
};

class GemmTunerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AGENTKV_REQUIRE_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cublasCreate(&cublas_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(cublas_, stream_), CUBLAS_STATUS_SUCCESS);
    ASSERT_TRUE(ws_.Allocate(8u << 20).ok());
    ASSERT_EQ(cublasSetWorkspace(cublas_, ws_.get(), ws_.bytes()), CUBLAS_STATUS_SUCCESS);
    ASSERT_TRUE(tuner_.Init(stream_, ws_.get(), ws_.bytes(), /*log=*/false).ok());
  }
  void TearDown() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Runs m rows through the tuner (or cublasGemmEx where it declines) and
  // returns y as floats. beta 0: y poisoned with NaN first; else y0 everywhere.
  std::vector<float> RunRows(Gemm& g, int m, bool f32, float beta, float y0, bool* ran) {
    const size_t count = static_cast<size_t>(m) * g.n;
    if (f32) {
      std::vector<float> init(count, beta != 0.f ? y0 : NAN);
      EXPECT_EQ(cudaMemcpy(g.dy.get(), init.data(), count * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    } else {
      std::vector<uint16_t> init(count, beta != 0.f ? ToBf16(y0) : 0x7fc0);
      EXPECT_EQ(cudaMemcpy(g.dy.get(), init.data(), count * 2, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    const auto* x = g.dx.get<kernels::bf16_t>();
    const auto* w = g.dw.get<kernels::bf16_t>();
    EXPECT_TRUE(tuner_.Run(x, w, g.dy.get(), f32, m, g.n, g.k, beta, ran).ok());
    if (!*ran) {
      EXPECT_EQ(cuda::GemmTuner::Default(cublas_, x, w, g.dy.get(), f32, m, g.n, g.k, beta),
                CUBLAS_STATUS_SUCCESS);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<float> y(count);
    if (f32) {
      EXPECT_EQ(cudaMemcpy(y.data(), g.dy.get(), count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::vector<uint16_t> b(count);
      EXPECT_EQ(cudaMemcpy(b.data(), g.dy.get(), count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < count; ++i) y[i] = FromBf16(b[i]);
    }
    return y;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::DeviceBuffer ws_;
  cuda::GemmTuner tuner_;
};

TEST_F(GemmTunerTest, TunedAlgorithmsMatchTheReferenceAtAndBetweenAnchors) {
  Gemm g;
  for (const bool f32 : {false, true}) {
    const float beta = f32 ? 1.f : 0.f, y0 = f32 ? 3.f : 0.f;
    for (int anchor : {512, 1024}) {
      // Tuning writes y: it is re-initialised by RunRows before each check.
      ASSERT_TRUE(tuner_
                      .Tune(cublas_, g.dx.get<kernels::bf16_t>(), g.dw.get<kernels::bf16_t>(),
                            g.dy.get(), f32, anchor, g.n, g.k, beta)
                      .ok());
    }
    for (int m : {512, 520, 1024, 704}) {
      bool ran = false;
      const std::vector<float> y = RunRows(g, m, f32, beta, y0, &ran);
      const std::vector<float> ref = g.Reference(m, beta, y0);
      EXPECT_LT(RelErr(y, ref), f32 ? 1e-5 : 8e-3)
          << "m " << m << (f32 ? " fp32" : " bf16") << (ran ? " (tuned)" : " (default)");
    }
  }
  std::printf("anchors tuned away from the default: %d of 4\n", tuner_.tuned_non_default());
}

TEST_F(GemmTunerTest, DeclinesRowsNoAnchorCovers) {
  Gemm g;
  ASSERT_TRUE(tuner_
                  .Tune(cublas_, g.dx.get<kernels::bf16_t>(), g.dw.get<kernels::bf16_t>(),
                        g.dy.get(), false, 512, g.n, g.k, 0.f)
                  .ok());
  bool ran = true;
  // More rows than the largest anchor, another shape, another output type.
  ASSERT_TRUE(tuner_
                  .Run(g.dx.get<kernels::bf16_t>(), g.dw.get<kernels::bf16_t>(), g.dy.get(), false,
                       513, g.n, g.k, 0.f, &ran)
                  .ok());
  EXPECT_FALSE(ran);
  ran = true;
  ASSERT_TRUE(tuner_
                  .Run(g.dx.get<kernels::bf16_t>(), g.dw.get<kernels::bf16_t>(), g.dy.get(), false,
                       256, g.n / 2, g.k, 0.f, &ran)
                  .ok());
  EXPECT_FALSE(ran);
  ran = true;
  ASSERT_TRUE(tuner_
                  .Run(g.dx.get<kernels::bf16_t>(), g.dw.get<kernels::bf16_t>(), g.dy.get(), true,
                       256, g.n, g.k, 0.f, &ran)
                  .ok());
  EXPECT_FALSE(ran);
}

TEST(GemmTunerNoInit, RunDeclinesAndTuneFails) {
  AGENTKV_REQUIRE_GPU();
  cuda::GemmTuner t;
  bool ran = true;
  EXPECT_TRUE(t.Run(nullptr, nullptr, nullptr, false, 512, 8, 8, 0.f, &ran).ok());
  EXPECT_FALSE(ran);
  EXPECT_FALSE(t.Tune(nullptr, nullptr, nullptr, nullptr, false, 512, 8, 8, 0.f).ok());
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(GemmTuner, NeedsCuda) { AGENTKV_REQUIRE_GPU(); }

#endif  // AGENTKV_HAVE_CUDA
