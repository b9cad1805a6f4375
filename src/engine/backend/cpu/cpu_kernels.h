// Plain C++ kernels of the forward pass. They are the CPU backend's building
// blocks and the references the CUDA kernels are tested against. All take
// fp32, row-major; none allocates; all are thread-safe on disjoint outputs.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "util/thread_pool.h"

namespace agentkv::backend::cpu::kernels {

// y[r] = x[r] / rms(x[r]) * w (or * (1 + w) for Gemma), per row of `dim`.
// x and y may alias.
void RmsNorm(const float* x, const float* w, float* y, int64_t rows, int dim, float eps,
             bool plus_one);

// Rotates `heads` vectors of `head_dim` at `pos` in place, in the
// rotate-half convention (pairs i and i + head_dim / 2), cos and sin
// multiplied by `scale` (YaRN's attention factor; 1 otherwise).
void ApplyRope(float* x, int heads, int head_dim, int32_t pos, const float* inv_freq,
               float scale = 1.0f);

// x = act(gate) * up over n elements; gate_up holds [gate | up] rows of 2n.
void GatedActivation(const float* gate_up, float* out, int64_t rows, int n, model::Activation act);

// q . k over n floats; AVX2 when n is a multiple of 8.
inline float Dot(const float* a, const float* b, int n) {
  if (n % 8 == 0) {
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < n; d += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
  }
  float s = 0.f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// out += p * v over n floats.
inline void Axpy(float p, const float* v, float* out, int n) {
  if (n % 8 == 0) {
    const __m256 pv = _mm256_set1_ps(p);
    for (int d = 0; d < n; d += 8)
      _mm256_storeu_ps(out + d,
                       _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
    return;
  }
  for (int d = 0; d < n; ++d) out[d] += p * v[d];
}

// Softmax-weighted sum for one query head over `n` keys:
//   out = sum_j softmax(scale * q.k_j (soft-capped))_j * v_j
// key(j) / value(j) return pointers to head_dim floats; `scores` holds n
// floats. A finite `sink` (GPT-OSS) is one more logit in the denominator,
// unscaled and without a value: p_j = e^{s_j} / (sum_i e^{s_i} + e^{sink}).
template <typename KeyFn, typename ValFn>
inline void AttendOne(const float* q, int n, int head_dim, float scale, float softcap, KeyFn key,
                      ValFn value, float* scores, float* out, float sink = -INFINITY) {
  float mx = sink > -3.0e38f ? sink : -3.0e38f;
  for (int j = 0; j < n; ++j) {
    float s = Dot(q, key(j), head_dim) * scale;
    if (softcap > 0.f) s = softcap * std::tanh(s / softcap);
    scores[j] = s;
    if (s > mx) mx = s;
  }
  float sum = sink > -INFINITY ? std::exp(sink - mx) : 0.f;
  for (int j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  for (int d = 0; d < head_dim; ++d) out[d] = 0.f;
  const float inv = 1.f / sum;
  for (int j = 0; j < n; ++j) Axpy(scores[j] * inv, value(j), out, head_dim);
}

// out[r][c] = x[r] . w[c] (+ bias[c]): y = x W^T with W [n][k] row-major.
// Few rows (decode steps) take a weight-streaming kernel that reads each
// weight row once for all of x, split over `pool`'s threads; many rows go to
// OpenBLAS sgemm, whose packing of W only pays off then.
void Linear(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k, ThreadPool* pool = nullptr);
// The same with W in bf16 (exactly the checkpoint's values, half the bytes).
void LinearBf16(const float* x, const uint16_t* w, float* y, int64_t m, int64_t n, int64_t k,
                ThreadPool* pool = nullptr);

// Rows up to which Linear streams weights instead of calling sgemm.
inline constexpr int64_t kSmallM = 16;

}  // namespace agentkv::backend::cpu::kernels
