// Small ModelCacheSpecs for the cache tests.
#pragma once

#include <vector>

#include "cache/model_cache_spec.h"

namespace agentkv::testing {

inline cache::ModelCacheSpec MakeSpec(const std::vector<int>& windows, int kv_heads = 2,
                                      int head_dim = 4) {
  cache::ModelCacheSpec s;
  s.num_layers = static_cast<int>(windows.size());
  s.num_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.kv_dtype = cache::KvDtype::kF32;
  for (int w : windows) {
    s.layer_kinds.push_back(w > 0 ? cache::AttentionKind::kSliding : cache::AttentionKind::kFull);
    s.layer_windows.push_back(w);
  }
  s.BuildGroups();
  return s;
}

// Two full-attention layers: one group.
inline cache::ModelCacheSpec FullSpec() { return MakeSpec({0, 0}); }
// Gemma-3-like: sliding (window `window`) and full layers interleaved; group 0
// is sliding, group 1 full.
inline cache::ModelCacheSpec SlidingSpec(int window) {
  return MakeSpec({window, window, 0, window});
}

}  // namespace agentkv::testing
