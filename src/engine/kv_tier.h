// KvTier: a slower home for KV blocks than the pool (the persistent store;
// later a host-memory tier). The engine asks it for the blocks that continue
// a request's resident prefix before prefilling, and hands it the blocks of
// every finished agent turn, write-behind.
//
// Blocks are whole full-attention blocks in the backend's ReadBlock layout,
// addressed by their chained BlockHash (cache/block_hash.h), so a block is
// only ever found for exactly the token prefix it was computed from. The
// tier is bound to one model and KV format (fingerprint): a block written
// under another never comes back.
//
// Thread-safety: Load is called on the engine's loader thread, Save and
// Flush on the engine thread or any other; implementations must allow them
// concurrently. Save must not block on I/O (the engine thread calls it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "util/status.h"

namespace agentkv {

struct KvTierBlock {
  BlockHash hash;
  std::vector<int32_t> tokens;  // block_size tokens
  std::string data;             // KV bytes; empty in Save: "already stored"
};

struct KvTierLoad {
  std::vector<KvTierBlock> blocks;  // continue the prefix, in order
  // OK, or why the run stopped early (a corrupt record): reported, not fatal.
  Status problem;
};

class KvTier {
 public:
  virtual ~KvTier() = default;

  // Where blocks come from, for usage reports ("disk", "host").
  virtual const char* source_name() const = 0;

  // The longest run of stored blocks continuing full block `first_block` of
  // `tokens` (hashes[first_block ...] chained from the start of `tokens`),
  // at most `max_blocks`. Fails only on I/O errors.
  virtual Result<KvTierLoad> Load(std::span<const int32_t> tokens, int block_size,
                                  int32_t first_block, int32_t max_blocks) = 0;

  // Persists blocks [first_index, first_index + blocks.size()) of
  // `agent_key`'s token chain (its chain is cut after them). Write-behind:
  // returns at once; a block may be dropped under pressure (KV is a cache).
  virtual void Save(const std::string& agent_key, uint32_t first_index,
                    std::vector<KvTierBlock> blocks) = 0;

  // Waits until every Save before it is durable; the first write error
  // since the previous Flush.
  virtual Status Flush() = 0;
};

}  // namespace agentkv
