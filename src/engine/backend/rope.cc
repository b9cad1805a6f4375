#include "engine/backend/rope.h"

#include <cmath>

namespace agentkv::kernels {

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

}  // namespace agentkv::kernels
