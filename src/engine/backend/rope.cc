#include "engine/backend/rope.h"

#include <algorithm>
#include <cmath>

namespace agentkv::backend {

std::vector<float> RopeInvFreq(const model::RopeSpec& rope, int head_dim) {
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
  } else if (rope.type == "yarn") {
    // Dimensions that turn more than beta_fast times over the original
    // context keep their frequency (extrapolation), those that turn fewer
    // than beta_slow times are divided by the factor (interpolation), with a
    // linear ramp between; as transformers computes it, in float32.
    const float kPi = 3.14159265358979323846f;
    const double dim = head_dim, base = rope.theta, ctx = rope.original_max_position;
    auto correction_dim = [&](double rotations) {
      return dim * std::log(ctx / (rotations * 2.0 * kPi)) / (2.0 * std::log(base));
    };
    double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
    if (rope.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // no division by zero
    // The bounds in double, the ramp in float32, as transformers has them.
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    for (int i = 0; i < half; ++i) {
      const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
      const float extrapolation = 1.0f - ramp;  // weight of the unscaled frequency
      const float pos_freq =
          std::pow(rope.theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
      const float interp = 1.0f / (rope.factor * pos_freq);
      inv[i] = interp * (1.0f - extrapolation) + inv[i] * extrapolation;
    }
  }
  return inv;
}

float RopeAttentionFactor(const model::RopeSpec& rope) {
  if (rope.type != "yarn") return 1.0f;
  if (rope.attention_factor > 0.0f) return rope.attention_factor;
  auto mscale = [](double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  if (rope.mscale != 0.0f && rope.mscale_all_dim != 0.0f)
    return static_cast<float>(mscale(rope.factor, rope.mscale) /
                              mscale(rope.factor, rope.mscale_all_dim));
  return static_cast<float>(mscale(rope.factor, 1.0));
}

}  // namespace agentkv::backend
