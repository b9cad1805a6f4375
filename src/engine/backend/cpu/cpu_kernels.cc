#include "engine/backend/cpu/cpu_kernels.h"

#include <cblas.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace agentkv::backend::cpu::kernels {

void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int dim, float eps,
             bool plus_one) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
    if (plus_one) {
      for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * (1.0f + w[i]);
    } else {
      for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
    }
  }
}

void ApplyRope(float* x, int heads, int head_dim, int32_t pos, const float* inv_freq, float scale) {
  const int half = head_dim / 2;
  float cs[512], sn[512];  // head_dim <= 1024
  for (int i = 0; i < half; ++i) {
    const float a = static_cast<float>(pos) * inv_freq[i];
    cs[i] = std::cos(a) * scale;
    sn[i] = std::sin(a) * scale;
  }
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

void GatedActivation(const float* gate_up, float* out, int64_t rows, int n, model::Activation act) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * n;
    const float* u = g + n;
    float* o = out + r * n;
    if (act == model::Activation::kSilu) {
      for (int i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    } else {
      // gelu, tanh approximation
      const float c = 0.7978845608028654f;  // sqrt(2 / pi)
      for (int i = 0; i < n; ++i) {
        const float x = g[i];
        o[i] = 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x))) * u[i];
      }
    }
  }
}

namespace {

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

inline __m256 LoadRow(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 LoadRow(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float Scalar(const float* p) { return *p; }
inline float Scalar(const uint16_t* p) {
  const uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// y[r][j] = x[r] . w[j] for the RM rows of x starting at x (row stride k,
// output row stride n) and j in [j0, j1). RM and QR (weight rows at once)
// are compile-time so the accumulators live in registers; several weight
// rows at once give the FMA units independent chains when RM is small.
template <int RM, int QR, typename W>
void RowsKernel(const float* x, const W* w, float* y, int64_t n, int64_t k, int64_t j0,
                int64_t j1) {
  const int64_t k8 = k & ~int64_t{7};
  int64_t j = j0;
  for (; j + QR <= j1; j += QR) {
    __m256 acc[RM][QR];
#pragma GCC unroll 8
    for (int r = 0; r < RM; ++r)
#pragma GCC unroll 8
      for (int q = 0; q < QR; ++q) acc[r][q] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k8; i += 8) {
      if constexpr (RM * QR + RM < 15) {
        __m256 xv[RM];
#pragma GCC unroll 8
        for (int r = 0; r < RM; ++r) xv[r] = _mm256_loadu_ps(x + r * k + i);
#pragma GCC unroll 8
        for (int q = 0; q < QR; ++q) {
          const __m256 wv = LoadRow(w + (j + q) * k + i);
#pragma GCC unroll 8
          for (int r = 0; r < RM; ++r) acc[r][q] = _mm256_fmadd_ps(wv, xv[r], acc[r][q]);
        }
      } else {
// Too many rows to keep x in registers too: x comes from L1.
#pragma GCC unroll 8
        for (int q = 0; q < QR; ++q) {
          const __m256 wv = LoadRow(w + (j + q) * k + i);
#pragma GCC unroll 8
          for (int r = 0; r < RM; ++r)
            acc[r][q] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * k + i), acc[r][q]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RM; ++r)
#pragma GCC unroll 8
      for (int q = 0; q < QR; ++q) {
        float s = HorizontalSum(acc[r][q]);
        for (int64_t i = k8; i < k; ++i) s += Scalar(w + (j + q) * k + i) * x[r * k + i];
        y[r * n + j + q] = s;
      }
  }
  if (j < j1) RowsKernel<RM, 1>(x, w, y, n, k, j, j1);
}

template <typename W>
void StreamRows(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k, int64_t j0,
                int64_t j1) {
  for (int64_t r0 = 0; r0 < m; r0 += 8) {
    const float* xr = x + r0 * k;
    float* yr = y + r0 * n;
    switch (std::min<int64_t>(8, m - r0)) {
      case 1:
        RowsKernel<1, 4>(xr, w, yr, n, k, j0, j1);
        break;
      case 2:
        RowsKernel<2, 4>(xr, w, yr, n, k, j0, j1);
        break;
      case 3:
        RowsKernel<3, 2>(xr, w, yr, n, k, j0, j1);
        break;
      case 4:
        RowsKernel<4, 2>(xr, w, yr, n, k, j0, j1);
        break;
      case 5:
        RowsKernel<5, 2>(xr, w, yr, n, k, j0, j1);
        break;
      case 6:
        RowsKernel<6, 2>(xr, w, yr, n, k, j0, j1);
        break;
      case 7:
        RowsKernel<7, 1>(xr, w, yr, n, k, j0, j1);
        break;
      default:
        RowsKernel<8, 1>(xr, w, yr, n, k, j0, j1);
        break;
    }
  }
}

template <typename W>
void StreamLinear(const float* x, const W* w, float* y, int64_t m, int64_t n, int64_t k,
                  ThreadPool* pool) {
  constexpr int64_t kRowsPerTask = 64;
  const int64_t tasks = (n + kRowsPerTask - 1) / kRowsPerTask;
  auto run = [&](int64_t t, int) {
    StreamRows(x, w, y, m, n, k, t * kRowsPerTask, std::min(n, (t + 1) * kRowsPerTask));
  };
  if (pool) {
    pool->ParallelFor(tasks, 4, run);
  } else {
    for (int64_t t = 0; t < tasks; ++t) run(t, 0);
  }
}

}  // namespace

void LinearBf16(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                ThreadPool* pool) {
  StreamLinear(x, w, y, m, n, k, pool);
}

void Linear(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k, ThreadPool* pool) {
  if (m <= kSmallM) {
    StreamLinear(x, w, y, m, n, k, pool);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y,
                static_cast<int>(n));
  }
  if (bias) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] += bias[c];
  }
}

}  // namespace agentkv::backend::cpu::kernels
