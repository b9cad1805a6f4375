#include "engine/cpu_kernels.h"

#include <cblas.h>

#include <cmath>

namespace agentkv::kernels {

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

std::vector<float> RopeInvFreq(const RopeSpec& rope, int head_dim) {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // Same arithmetic as the reference: theta ** (2i / d) in float32.
    inv[i] = 1.0f / std::pow(rope.theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  if (rope.type == "linear") {
    for (float& f : inv) f /= rope.factor;
  } else if (rope.type == "llama3") {
    const float kPi = 3.14159265358979323846f;
    const float old_ctx = static_cast<float>(rope.original_max_position);
    const float low_wavelen = old_ctx / rope.low_freq_factor;
    const float high_wavelen = old_ctx / rope.high_freq_factor;
    for (float& f : inv) {
      const float wavelen = 2.0f * kPi / f;
      if (wavelen > low_wavelen) {
        f = f / rope.factor;
      } else if (wavelen >= high_wavelen) {
        const float smooth = (old_ctx / wavelen - rope.low_freq_factor) /
                             (rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0f - smooth) * f / rope.factor + smooth * f;
      }
    }
  }
  return inv;
}

void ApplyRope(float* x, int heads, int head_dim, int32_t pos, const float* inv_freq) {
  const int half = head_dim / 2;
  float cs[512], sn[512];  // head_dim <= 1024
  for (int i = 0; i < half; ++i) {
    const float a = static_cast<float>(pos) * inv_freq[i];
    cs[i] = std::cos(a);
    sn[i] = std::sin(a);
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

void GatedActivation(const float* gate_up, float* out, int64_t rows, int n, Activation act) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * n;
    const float* u = g + n;
    float* o = out + r * n;
    if (act == Activation::kSilu) {
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

void Linear(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y,
              static_cast<int>(n));
  if (bias) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] += bias[c];
  }
}

}  // namespace agentkv::kernels
