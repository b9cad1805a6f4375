// BlockHash: content address of one full KV block, chained over the hash of
// the block before it, so equal hashes mean equal whole prefixes (not just
// equal blocks). 128-bit XXH3: an accidental collision is not a practical
// concern, and the prefix cache still compares the stored tokens before it
// reuses a block. The same hashes can key persisted KV blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace agentkv {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;
};

// The parent of a sequence's first block.
inline constexpr BlockHash kRootBlockHash{};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
};

// Hash of a block with `tokens` whose preceding block hashed to `parent`.
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens);

// Chained hashes of every full block of `tokens` (a trailing partial block is
// not hashed).
std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int block_size,
                                      BlockHash parent = kRootBlockHash);

}  // namespace agentkv
