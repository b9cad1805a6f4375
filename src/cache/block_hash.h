// BlockHash: content address of one full KV block, chained over the hash of
// the block before it, so equal hashes mean equal whole prefixes (not just
// equal blocks). 128-bit XXH3: an accidental collision is not a practical
// concern, and the prefix cache still compares the stored tokens before it
// reuses a block. The same hashes can key persisted KV blocks.
//
// Salted chains (tenants): a chain starts at the parent ChainRoot(salt)
// instead of kRootBlockHash, so the same tokens under another salt hash
// differently at every block, and no cache or tier keyed by these hashes
// (the prefix cache, the host tier, the store) ever finds one salt's
// blocks for another (vLLM's cache_salt). The empty salt is the unsalted
// chain, bit for bit what chains were before salts existed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace agentkv::cache {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;
};

// The parent of a sequence's first block in an unsalted chain.
inline constexpr BlockHash kRootBlockHash{};

// The parent of a chain's first block under `salt`: kRootBlockHash for the
// empty salt, else a hash of the salt (domain-separated from block hashes,
// whose input starts with a parent hash). Pure.
BlockHash ChainRoot(std::string_view salt);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
};

// Hash of a block with `tokens` whose preceding block hashed to `parent`.
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens);

// Chained hashes of every full block of `tokens` (a trailing partial block is
// not hashed), the first one's parent being `parent` (a ChainRoot, or the
// hash of the block before `tokens`).
std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int block_size,
                                      BlockHash parent = kRootBlockHash);

}  // namespace agentkv::cache
