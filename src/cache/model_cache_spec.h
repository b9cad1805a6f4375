// ModelCacheSpec: the shape of a model's KV cache, derived from config.json by
// engine/model/model_config (cache/ knows nothing of configs). The block pool is
// configured from it.
//
// Layers are split into cache groups: one group per distinct attention kind
// and window. Every group has its own blocks and its own block table per
// sequence; a block of a group holds `block_size` tokens of K and V for every
// layer in the group. Sliding-window groups are rings: a sequence holds at most
// RingBlocks() blocks of them, however long its context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace agentkv::cache {

enum class AttentionKind { kFull, kSliding };
// kFP8E4M3: e4m3 bytes with one f32 scale per (token, KV head) row of K and
// of V (engine/backend/kv_fp8.h, docs/kv-fp8.md): head_dim + 4 bytes a row.
enum class KvDtype { kF32, kBF16, kF16, kFP8E4M3 };

// Bytes of one element's value (1 for fp8; its row scales are extra).
size_t KvDtypeBytes(KvDtype d);
// "f32", "bf16", "f16", "fp8_e4m3".
const char* KvDtypeName(KvDtype d);

struct CacheGroupSpec {
  AttentionKind kind = AttentionKind::kFull;
  int window = 0;           // tokens a query sees, itself included; 0 for full
  std::vector<int> layers;  // model layer indices in this group, ascending
};

struct ModelCacheSpec {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype kv_dtype = KvDtype::kF32;
  std::vector<AttentionKind> layer_kinds;  // per layer
  std::vector<int> layer_windows;          // per layer; 0 for full attention
  std::vector<CacheGroupSpec> groups;      // built by BuildGroups()

  // Fills `groups` from layer_kinds/layer_windows.
  void BuildGroups();
  // Group index and position within that group of a model layer.
  int GroupOf(int layer) const;
  int IndexInGroup(int layer) const;

  // K and V of one token in one layer (for fp8 with the rows' scales).
  size_t BytesPerTokenPerLayer() const;
  // K and V of one block of `block_size` tokens for every layer in group g.
  size_t BytesPerBlock(int g, int block_size) const;
  // Blocks a sequence of `tokens` tokens holds in group g: a ring for
  // sliding groups, ceil(window / block_size) + 1 at most.
  int BlocksFor(int g, int64_t tokens, int block_size) const;
  int RingBlocks(int g, int block_size) const;  // 0 for full groups

  std::string ToString() const;
};

}  // namespace agentkv::cache
