// Shared by the kernel tests: each CUDA kernel against its CPU reference
// (engine/backend/cpu/cpu_kernels.h) on fresh random inputs, outputs
// poisoned with NaN before the launch so an unwritten element fails.
// Tolerances (relative L2 error): 1e-2 where the kernel's output is bf16
// (rounding alone is ~3e-3); 2e-2 for attention, whose probabilities also
// pass through bf16 on the tensor cores; 1e-5 for the decode GEMV's fp32
// output (same products, another summation order); exact for argmax.
// CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "engine/backend/cpu/cpu_kernels.h"
#include "engine/backend/cuda/kernels/attention.h"

namespace agentkv::testing {

inline std::vector<float> Random(size_t n, std::mt19937& rng, float sd = 1.f, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
inline std::vector<uint16_t> Bf16Of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = ToBf16(v[i]);
  return b;
}
inline std::vector<float> Rounded(std::vector<float> v) {
  for (auto& x : v) x = RoundBf16(x);
  return v;
}

// gate_up rows [gate | up] (the CPU reference's layout) as the CUDA kernels
// take them: gate and up interleaved.
inline std::vector<float> Interleaved(const std::vector<float>& gu, int rows, int n) {
  std::vector<float> out(gu.size());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) {
      out[(static_cast<size_t>(r) * n + i) * 2] = gu[static_cast<size_t>(r) * 2 * n + i];
      out[(static_cast<size_t>(r) * n + i) * 2 + 1] = gu[static_cast<size_t>(r) * 2 * n + n + i];
    }
  return out;
}

// Points p at a step's metadata on the device (positions, sequence starts
// and first tokens, tiles as {seq, t0, n}) and sets its shape.
inline void SetStep(backend::cuda::kernels::AttentionParams& p,
                    const backend::cuda::DeviceBuffer& pos,
                    const backend::cuda::DeviceBuffer& seq_start,
                    const backend::cuda::DeviceBuffer& seq_first,
                    std::array<const backend::cuda::DeviceBuffer*, 3> tiles, int num_tiles,
                    int tokens, int nh, int nkv, int head_dim) {
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
inline std::vector<float> InterleaveGateUp(const std::vector<float>& w, int n, int k) {
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
inline void ExpectLinearThenGated(const backend::cuda::DeviceBuffer& out,
                                  const std::vector<float>& x, const std::vector<float>& w, int m,
                                  int n, int k, model::Activation a) {
  std::vector<float> gu(static_cast<size_t>(m) * 2 * n), ref(static_cast<size_t>(m) * n);
  backend::cpu::kernels::Linear(x.data(), w.data(), nullptr, gu.data(), m, 2 * n, k);
  backend::cpu::kernels::GatedActivation(gu.data(), ref.data(), m, n, a);
  EXPECT_LT(RelErr(DownloadBf16(out, ref.size()), ref), 1e-2) << m << " " << n << " " << k;
}

// Runs `launch(x, w, y, beta)` twice for y = x . w^T (+ y0, fp32 with beta
// 1; bf16, poisoned, with beta 0) against the CPU Linear: within 1e-5
// (fp32) or 1e-2 (bf16), and the same bits both times.
template <typename Launch>
inline void CheckGemmAgainstLinear(int m, int n, int k, bool f32, std::mt19937& rng,
                                   const std::string& what, Launch launch) {
  const auto x = Rounded(Random(m * k, rng)),
             w = Rounded(Random(static_cast<size_t>(n) * k, rng, 0.05f));
  const auto y0 = Rounded(Random(m * n, rng));
  auto dx = Upload(Bf16Of(x)), dw = Upload(Bf16Of(w));
  const float beta = f32 ? 1.f : 0.f;
  std::vector<float> ref(m * n);
  backend::cpu::kernels::Linear(x.data(), w.data(), nullptr, ref.data(), m, n, k);
  for (int i = 0; i < m * n; ++i) ref[i] += beta * y0[i];
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    backend::cuda::DeviceBuffer dy = f32 ? Upload(y0) : Poisoned<uint16_t>(m * n);
    ASSERT_EQ(launch(dx.get<backend::cuda::kernels::bf16_t>(),
                     dw.get<backend::cuda::kernels::bf16_t>(), dy.get(), beta),
              cudaSuccess)
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

// The SM count of device 0 if its compute capability is 9.0 (the warpgroup
// GEMM's), else 0.
inline int Cc90Sms() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0)
    return 0;
  return prop.multiProcessorCount;
}

}  // namespace agentkv::testing
