// RopeInvFreq: the inverse frequencies of rotary embeddings a model's
// RopeSpec defines. Both backends rotate with this one table (the CPU
// backend per position, the CUDA backend uploads it), so they agree on the
// scaling. Pure; thread-safe.
#pragma once

#include <vector>

#include "engine/model/model_config.h"

namespace agentkv::backend {

// head_dim / 2 inverse frequencies, with the scaling of `rope` applied
// (linear, llama3, yarn).
std::vector<float> RopeInvFreq(const model::RopeSpec& rope, int head_dim);

// The factor that multiplies cos and sin (so q and k): YaRN's attention
// factor (given, or 0.1 ln(factor) + 1, or the mscale / mscale_all_dim
// ratio); 1 for every other type.
float RopeAttentionFactor(const model::RopeSpec& rope);

}  // namespace agentkv::backend
