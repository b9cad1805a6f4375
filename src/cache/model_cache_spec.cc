#include "cache/model_cache_spec.h"

#include <algorithm>
#include <sstream>

namespace agentkv::cache {

size_t KvDtypeBytes(KvDtype d) {
  switch (d) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kBF16:
      return 2;
    case KvDtype::kF16:
      return 2;
    case KvDtype::kFP8E4M3:
      return 1;
  }
  return 4;
}

const char* KvDtypeName(KvDtype d) {
  switch (d) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "?";
}

void ModelCacheSpec::BuildGroups() {
  groups.clear();
  for (int l = 0; l < num_layers; ++l) {
    AttentionKind kind = layer_kinds.at(l);
    int window = kind == AttentionKind::kSliding ? layer_windows.at(l) : 0;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const CacheGroupSpec& g) {
      return g.kind == kind && g.window == window;
    });
    if (it == groups.end()) {
      groups.push_back(CacheGroupSpec{kind, window, {}});
      it = groups.end() - 1;
    }
    it->layers.push_back(l);
  }
}

int ModelCacheSpec::GroupOf(int layer) const {
  for (size_t g = 0; g < groups.size(); ++g)
    for (int l : groups[g].layers)
      if (l == layer) return static_cast<int>(g);
  return -1;
}

int ModelCacheSpec::IndexInGroup(int layer) const {
  for (const auto& g : groups)
    for (size_t i = 0; i < g.layers.size(); ++i)
      if (g.layers[i] == layer) return static_cast<int>(i);
  return -1;
}

size_t ModelCacheSpec::BytesPerTokenPerLayer() const {
  // fp8: each (token, KV head) row of K and of V carries an f32 scale.
  const size_t row_extra = kv_dtype == KvDtype::kFP8E4M3 ? 4 : 0;
  return 2 * static_cast<size_t>(num_kv_heads) * (head_dim * KvDtypeBytes(kv_dtype) + row_extra);
}

size_t ModelCacheSpec::BytesPerBlock(int g, int block_size) const {
  return BytesPerTokenPerLayer() * block_size * groups.at(g).layers.size();
}

int ModelCacheSpec::RingBlocks(int g, int block_size) const {
  const auto& grp = groups.at(g);
  if (grp.kind != AttentionKind::kSliding) return 0;
  return (grp.window + block_size - 1) / block_size + 1;
}

int ModelCacheSpec::BlocksFor(int g, int64_t tokens, int block_size) const {
  int64_t n = (tokens + block_size - 1) / block_size;
  int ring = RingBlocks(g, block_size);
  if (ring > 0 && n > ring) n = ring;
  return static_cast<int>(n);
}

std::string ModelCacheSpec::ToString() const {
  std::ostringstream os;
  os << "layers=" << num_layers << " kv_heads=" << num_kv_heads << " head_dim=" << head_dim
     << " kv=" << KvDtypeName(kv_dtype) << " bytes/token/layer=" << BytesPerTokenPerLayer()
     << " groups=[";
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g) os << ", ";
    os << (groups[g].kind == AttentionKind::kFull ? "full" : "sliding");
    if (groups[g].window) os << "(" << groups[g].window << ")";
    os << " x" << groups[g].layers.size();
  }
  os << "]";
  return os.str();
}

}  // namespace agentkv::cache
