#include "engine/backend/cpu/cpu_quant_matmul.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../../model/quant_test_util.h"
#include "engine/model/quant_pack.h"

namespace agentkv::backend::cpu {
namespace {

using ::testing::HasSubstr;
using testing::RefE4m3;
using testing::RefFp4;

std::vector<float> Randn(int64_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

model::QuantizedWeight Fp8Block(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> w = Randn(rows * cols, seed, 0.05f);
  model::QuantizedWeight q;
  q.format = model::QuantFormat::kFp8Block;
  q.rows = rows;
  q.cols = cols;
  q.block_rows = 128;
  q.block_cols = 128;
  q.codes.resize(rows * cols);
  q.scales.resize(((rows + 127) / 128) * ((cols + 127) / 128));
  model::PackFp8Block(w.data(), rows, cols, 128, 128, q.codes.data(), q.scales.data());
  return q;
}

model::QuantizedWeight Fp8Channel(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> w = Randn(rows * cols, seed, 0.05f);
  model::QuantizedWeight q;
  q.format = model::QuantFormat::kFp8Channel;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(rows * cols);
  q.scales.resize(rows);
  model::PackFp8Channel(w.data(), rows, cols, q.codes.data(), q.scales.data());
  return q;
}

// The test's own dequantization, element by element from the definitions.
float RefElement(const model::QuantizedWeight& q, int64_t b, int64_t r, int64_t c) {
  const int64_t row = b * q.rows + r;
  switch (q.format) {
    case model::QuantFormat::kFp8Block: {
      const int64_t tc = (q.cols + q.block_cols - 1) / q.block_cols;
      const int64_t tr = (q.rows + q.block_rows - 1) / q.block_rows;
      return RefE4m3(q.codes[row * q.cols + c]) *
             q.scales[(b * tr + r / q.block_rows) * tc + c / q.block_cols];
    }
    case model::QuantFormat::kFp8Channel:
      return RefE4m3(q.codes[row * q.cols + c]) * q.scales[row];
    case model::QuantFormat::kFp8Tensor:
      return RefE4m3(q.codes[row * q.cols + c]) * q.scales[b];
    case model::QuantFormat::kMxfp4: {
      const uint8_t byte = q.codes[(row * q.cols + c) / 2];
      const int e = q.exponents[row * (q.cols / 32) + c / 32];
      return RefFp4(c % 2 ? byte >> 4 : byte & 15) * std::ldexp(1.f, e - 127);
    }
  }
  return 0;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  double amax = 0;
  for (double v : want) amax = std::max(amax, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * amax + 1e-7) << i;
}

TEST(CpuQuantMatmulTest, StackedPartsMatchTheDequantizedProduct) {
  const int64_t K = 200;  // two 128-wide tiles, the second ragged
  QuantMatrix m;
  model::QuantizedWeight a = Fp8Block(300, K, 1), b = Fp8Channel(20, K, 2);
  std::vector<float> f = Randn(7 * K, 3, 0.05f);
  ASSERT_TRUE(m.Append(a).ok());
  ASSERT_TRUE(m.Append(b).ok());
  ASSERT_TRUE(m.AppendF32(f, 7, K).ok());
  EXPECT_EQ(m.rows(), 327);
  EXPECT_EQ(m.cols(), K);
  EXPECT_EQ(m.bytes(), a.bytes() + b.bytes() + f.size() * 4);
  std::vector<float> bias = Randn(327, 4);
  ThreadPool pool(3);
  for (int64_t rows : {1, 5, 16, 17, 70}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> x = Randn(rows * K, 10 + rows);
      std::vector<double> want(rows * 327);
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t o = 0; o < 327; ++o) {
          double s = bias[o];
          for (int64_t c = 0; c < K; ++c) {
            const float wv = o < 300   ? RefElement(a, 0, o, c)
                             : o < 320 ? RefElement(b, 0, o - 300, c)
                                       : f[(o - 320) * K + c];
            s += static_cast<double>(wv) * x[t * K + c];
          }
          want[t * 327 + o] = s;
        }
      QuantScratch scratch;
      std::vector<float> y(rows * 327);
      QuantLinear(x.data(), m, bias.data(), y.data(), rows, p, scratch);
      SCOPED_TRACE(rows);
      ExpectClose(y, want);
      // And through DenseLinear with no fp32 matrix.
      std::vector<float> y2(rows * 327);
      DenseLinear(x.data(), {}, m, bias.data(), y2.data(), rows, 327, K, p, scratch);
      EXPECT_EQ(y2, y);
    }
  }
}

TEST(CpuQuantMatmulTest, OneExpertOfABatchedMxfp4Weight) {
  const int64_t E = 3, N = 40, K = 96;
  std::vector<float> w = Randn(E * N * K, 5, 0.05f);
  model::QuantizedWeight q;
  q.format = model::QuantFormat::kMxfp4;
  q.batch = E;
  q.rows = N;
  q.cols = K;
  q.codes.resize(E * N * K / 2);
  q.exponents.resize(E * N * K / 32);
  model::PackMxfp4(w.data(), E * N, K, q.codes.data(), q.exponents.data());
  ASSERT_TRUE(q.Validate().ok());
  ThreadPool pool(2);
  for (int64_t rows : {2, 33}) {
    std::vector<float> x = Randn(rows * K, 7);
    std::vector<double> want(rows * N);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t o = 0; o < N; ++o) {
        double s = 0;
        for (int64_t c = 0; c < K; ++c)
          s += static_cast<double>(RefElement(q, 2, o, c)) * x[t * K + c];
        want[t * N + o] = s;
      }
    QuantScratch scratch;
    std::vector<float> y(rows * N);
    QuantLinear(x.data(), q, 2, nullptr, y.data(), rows, &pool, scratch);
    ExpectClose(y, want);
  }
}

TEST(CpuQuantMatmulTest, AppendErrors) {
  QuantMatrix m;
  model::QuantizedWeight a = Fp8Channel(4, 64, 1);
  ASSERT_TRUE(m.Append(a).ok());
  EXPECT_THAT(m.Append(Fp8Channel(4, 32, 2)).message(), HasSubstr("input width"));
  EXPECT_THAT(m.AppendF32(std::vector<float>(4 * 32), 4, 32).message(), HasSubstr("input width"));
  EXPECT_THAT(m.AppendF32(std::vector<float>(5), 4, 64).message(), HasSubstr("size"));
  model::QuantizedWeight batched = Fp8Channel(4, 64, 3);
  batched.batch = 2;
  batched.codes.resize(2 * 4 * 64);
  batched.scales.resize(8);
  EXPECT_THAT(m.Append(batched).message(), HasSubstr("one matrix"));
  model::QuantizedWeight broken = Fp8Channel(4, 64, 4);
  broken.scales.pop_back();
  EXPECT_FALSE(m.Append(broken).ok());
  EXPECT_EQ(m.rows(), 4);
}

}  // namespace
}  // namespace agentkv::backend::cpu
