// KvTier: a slower home for KV blocks than the pool (the persistent store).
// The engine asks it for the blocks that continue a request's prefix before
// prefilling (after the pool and the host-memory tier, engine/host_kv_tier.h,
// which is the engine's own and not a KvTier), and hands it the blocks of
// every finished agent turn, write-behind.
//
// Blocks are whole full-attention blocks in the backend's ReadBlock layout,
// addressed by their chained BlockHash (cache/block_hash.h), so a block is
// only ever found for exactly the token prefix it was computed from, under
// the same salt (each lookup names its chain's root: ChainRoot). The
// tier is bound to one model and KV format (fingerprint): a block written
// under another never comes back.
//
// Thread-safety: Load is called on the engine's loader thread, Save and
// Flush on the engine thread or any other; implementations must allow them
// concurrently. Save must not block on I/O (the engine thread calls it).
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "util/shared_bytes.h"
#include "util/status.h"

namespace agentkv::cache {

struct KvTierBlock {
  BlockHash hash;
  std::vector<int32_t> tokens;  // block_size tokens
  SharedBytes data;             // KV bytes; empty in Save: "already stored"
};

struct KvTierLoad {
  std::vector<KvTierBlock> blocks;  // continue the prefix, in order
  // OK, or why the run stopped early (a corrupt record): reported, not fatal.
  Status problem;
};

struct KvTierLoadInto {
  int32_t blocks = 0;  // written to the caller's memory, in order
  Status problem;      // as KvTierLoad::problem
};

class KvTier {
 public:
  virtual ~KvTier() = default;

  // Where blocks come from, for usage reports ("disk", "host").
  virtual const char* source_name() const = 0;

  // The longest run of stored blocks continuing full block `first_block` of
  // `tokens` (hashes[first_block ...] chained from `root` at the start of
  // `tokens`), at most `max_blocks`. Fails only on I/O errors.
  virtual Result<KvTierLoad> Load(std::span<const int32_t> tokens, const BlockHash& root,
                                  int block_size, int32_t first_block, int32_t max_blocks) = 0;

  // How many stored blocks continue full block `first_block` of `tokens`
  // (as Load would find them, at most `max_blocks`), without reading their
  // data: the restore policy plans with it. May count a block whose record
  // turns out unreadable. The default says all of them (an upper bound).
  virtual Result<int32_t> CountStored(std::span<const int32_t> tokens, const BlockHash& root,
                                      int block_size, int32_t first_block, int32_t max_blocks) {
    (void)tokens;
    (void)root;
    (void)block_size;
    (void)first_block;
    return max_blocks;
  }

  // Load, with block i's data written to dst[i * block_bytes, +block_bytes)
  // instead of a string of its own, at most dst.size() / block_bytes blocks
  // (the engine hands pinned staging memory that the device copies from).
  // A stored block of another size ends the run as a problem. The default
  // goes through Load and copies.
  virtual Result<KvTierLoadInto> LoadInto(std::span<const int32_t> tokens, const BlockHash& root,
                                          int block_size, int32_t first_block, int32_t max_blocks,
                                          std::span<std::byte> dst, size_t block_bytes) {
    KvTierLoadInto out;
    if (block_bytes == 0) return out;
    const auto fit = static_cast<int32_t>(std::min<size_t>(dst.size() / block_bytes, INT32_MAX));
    ASSIGN_OR_RETURN(KvTierLoad got,
                     Load(tokens, root, block_size, first_block, std::min(max_blocks, fit)));
    out.problem = got.problem;
    for (const KvTierBlock& b : got.blocks) {
      if (b.data.size() != block_bytes) {
        out.problem = Corruption("stored KV block has " + std::to_string(b.data.size()) +
                                 " bytes, expected " + std::to_string(block_bytes));
        break;
      }
      std::memcpy(dst.data() + static_cast<size_t>(out.blocks) * block_bytes, b.data.data(),
                  block_bytes);
      ++out.blocks;
    }
    return out;
  }

  // Persists blocks [first_index, first_index + blocks.size()) of
  // `agent_key`'s token chain (its chain is cut after them). Write-behind:
  // returns at once; a block may be dropped under pressure (KV is a cache).
  // Block data may be slices of the engine's save staging: release them
  // once written or dropped (copy what is kept longer), since the engine's
  // later saves wait for that staging to come back.
  virtual void Save(const std::string& agent_key, uint32_t first_index,
                    std::vector<KvTierBlock> blocks) = 0;

  // Waits until every Save before it is durable; the first write error
  // since the previous Flush.
  virtual Status Flush() = 0;
};

}  // namespace agentkv::cache
