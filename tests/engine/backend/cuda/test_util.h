// Helpers of the CUDA tests: skip with a visible message when the build has
// no CUDA backend or the machine no GPU; device buffers filled from / read to
// host vectors; bf16 conversions; relative L2 error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#ifdef AGENTKV_HAVE_CUDA
#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/status.h"
#endif

#ifdef AGENTKV_HAVE_CUDA
#define AGENTKV_REQUIRE_GPU()                                                         \
  do {                                                                                \
    const ::agentkv::Status agentkv_gpu_ = agentkv::backend::cuda::DeviceAvailable(); \
    if (!agentkv_gpu_.ok()) GTEST_SKIP() << "no GPU: " << agentkv_gpu_.ToString();    \
  } while (0)
#else
#define AGENTKV_REQUIRE_GPU() GTEST_SKIP() << "built without CUDA (no toolkit found)"
#endif

namespace agentkv::testing {

inline uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float RoundBf16(float f) { return FromBf16(ToBf16(f)); }

// ||a - b|| / ||b||; infinite if any value is not finite.
inline double RelErr(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

#ifdef AGENTKV_HAVE_CUDA
template <typename T>
backend::cuda::DeviceBuffer Upload(const std::vector<T>& v) {
  backend::cuda::DeviceBuffer b;
  EXPECT_TRUE(b.Allocate(v.size() * sizeof(T)).ok());
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return b;
}
// A buffer of n T's filled with 0xff bytes: NaN as float and as bf16, -1 as int.
template <typename T>
backend::cuda::DeviceBuffer Poisoned(size_t n) {
  backend::cuda::DeviceBuffer b;
  EXPECT_TRUE(b.Allocate(n * sizeof(T)).ok());
  EXPECT_EQ(cudaMemset(b.get(), 0xff, n * sizeof(T)), cudaSuccess);
  return b;
}
template <typename T>
std::vector<T> Download(const backend::cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
inline std::vector<float> DownloadBf16(const backend::cuda::DeviceBuffer& b, size_t n) {
  std::vector<uint16_t> raw = Download<uint16_t>(b, n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = FromBf16(raw[i]);
  return f;
}
#endif

}  // namespace agentkv::testing
