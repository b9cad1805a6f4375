// The dequantization kernels (dequant.cu) against the CPU decoder
// (engine/model/quant_format.h's DequantizeRows) rounded to bf16 as the
// tensor cores' quantized tiles round them: random codes and scales, fp8
// with a scale per row and block of columns (the backend's QuantDense
// layout: blocks of 16 and 128, rows off every multiple, a last block cut
// short) and mxfp4 blocks of 32. Tolerance: none, every value bit for bit
// (one fp32 multiply of exact operands, then round to nearest even), NaN
// codes and exponents to NaN. Outputs poisoned (NaN) before each launch,
// with a poisoned tail past n * k that must stay so (no stray writes).
// Shapes the kernels refuse return cudaErrorInvalidValue.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/backend/cuda/kernels/dequant.h"
#include "engine/model/quant_format.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

constexpr size_t kTail = 64;  // poisoned values past the output

// Expects got[i] to be bf16(want[i]) bit for bit (NaN for NaN) and the tail
// still poisoned.
void ExpectBf16Of(const std::vector<uint16_t>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size() + kTail);
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool ok = std::isnan(want[i]) ? std::isnan(FromBf16(got[i])) : got[i] == ToBf16(want[i]);
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << "value " << i << ": got " << FromBf16(got[i]) << " want " << want[i];
  }
  EXPECT_EQ(bad, 0);
  for (size_t i = want.size(); i < got.size(); ++i)
    ASSERT_EQ(got[i], 0xffffu) << "written past the output at " << i;
}

TEST(CudaDequant, Fp8MatchesTheCpuBitForBit) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(5);
  struct Case {
    int n, k, bc;
  };
  for (const Case cs : {Case{64, 256, 128}, Case{40, 272, 128}, Case{17, 48, 16},
                        Case{3, 4112, 128}, Case{384, 1024, 128}, Case{5, 96, 96}}) {
    model::QuantizedWeight w;
    w.format = model::QuantFormat::kFp8Block;
    w.shape = {cs.n, cs.k};
    w.rows = cs.n;
    w.cols = cs.k;
    w.block_rows = 1;  // a scale per row and block of columns
    w.block_cols = cs.bc;
    w.codes.resize(static_cast<size_t>(cs.n) * cs.k);
    for (auto& c : w.codes) c = static_cast<uint8_t>(rng() & 0xff);  // NaN codes included
    const int nkb = (cs.k + cs.bc - 1) / cs.bc;
    w.scales.resize(static_cast<size_t>(cs.n) * nkb);
    std::uniform_real_distribution<float> ud(-12.f, 4.f);
    for (auto& s : w.scales) s = std::exp2(ud(rng));
    ASSERT_TRUE(w.Validate().ok());
    std::vector<float> want(w.codes.size());
    model::DequantizeRows(w, 0, 0, cs.n, want.data());
    const size_t n = want.size();
    cuda::DeviceBuffer codes = Upload(w.codes), scales = Upload(w.scales);
    cuda::DeviceBuffer out = Poisoned<uint16_t>(n + kTail);
    ASSERT_EQ(LaunchDequantFp8(codes.get<uint8_t>(), scales.get<float>(), cs.n, cs.k, cs.bc,
                               out.get<bf16_t>(), nullptr),
              cudaSuccess);
    SCOPED_TRACE(::testing::Message() << cs.n << " x " << cs.k << " blocks of " << cs.bc);
    ExpectBf16Of(Download<uint16_t>(out, n + kTail), want);
  }
}

TEST(CudaDequant, Mxfp4MatchesTheCpuBitForBit) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(6);
  for (const auto& [n, k] : {std::pair{64, 256}, std::pair{7, 32}, std::pair{130, 2880}}) {
    model::QuantizedWeight w;
    w.format = model::QuantFormat::kMxfp4;
    w.shape = {n, k};
    w.rows = n;
    w.cols = k;
    w.codes.resize(static_cast<size_t>(n) * k / 2);
    for (auto& c : w.codes) c = static_cast<uint8_t>(rng() & 0xff);
    w.exponents.resize(static_cast<size_t>(n) * k / model::kMxfp4Block);
    for (auto& e : w.exponents) e = static_cast<uint8_t>(100 + rng() % 40);
    w.exponents[0] = 255;  // NaN
    ASSERT_TRUE(w.Validate().ok());
    std::vector<float> want(static_cast<size_t>(n) * k);
    model::DequantizeRows(w, 0, 0, n, want.data());
    ASSERT_TRUE(std::isnan(want[0]));
    cuda::DeviceBuffer blocks = Upload(w.codes), exps = Upload(w.exponents);
    cuda::DeviceBuffer out = Poisoned<uint16_t>(want.size() + kTail);
    ASSERT_EQ(LaunchDequantMxfp4(blocks.get<uint8_t>(), exps.get<uint8_t>(), n, k,
                                 out.get<bf16_t>(), nullptr),
              cudaSuccess);
    SCOPED_TRACE(::testing::Message() << n << " x " << k);
    ExpectBf16Of(Download<uint16_t>(out, want.size() + kTail), want);
  }
}

TEST(CudaDequant, RefusesShapesOffTheLoads) {
  AGENTKV_REQUIRE_GPU();
  cuda::DeviceBuffer in = Poisoned<uint8_t>(4096), scales = Poisoned<float>(256);
  cuda::DeviceBuffer out = Poisoned<uint16_t>(4096);
  auto fp8 = [&](int n, int k, int bc) {
    return LaunchDequantFp8(in.get<uint8_t>(), scales.get<float>(), n, k, bc, out.get<bf16_t>(),
                            nullptr);
  };
  EXPECT_EQ(fp8(4, 40, 128), cudaErrorInvalidValue);  // k not whole 16-value loads
  EXPECT_EQ(fp8(4, 64, 8), cudaErrorInvalidValue);    // a load across two scales
  EXPECT_EQ(fp8(0, 64, 16), cudaErrorInvalidValue);
  EXPECT_EQ(
      LaunchDequantMxfp4(in.get<uint8_t>(), in.get<uint8_t>(), 4, 48, out.get<bf16_t>(), nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(DequantFp8Supported(4, 64, 16));
  EXPECT_FALSE(DequantFp8Supported(4, 64, 0));
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaDequant, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
