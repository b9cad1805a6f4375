#include "cache/block_hash.h"

// Exposes XXH3_state_t so the state can live on the stack.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace agentkv::cache {

namespace {

// Prefixed to a salt before hashing it into a chain root: no block hash's
// input (a 16-byte parent, then tokens) is meant to look like a root's.
constexpr std::string_view kSaltDomain = "agentkv-cache-salt-v1:";

}  // namespace

BlockHash ChainRoot(std::string_view salt) {
  if (salt.empty()) return kRootBlockHash;
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, kSaltDomain.data(), kSaltDomain.size());
  XXH3_128bits_update(&state, salt.data(), salt.size());
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const uint64_t p[2] = {parent.lo, parent.hi};
  XXH3_128bits_update(&state, p, sizeof(p));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int block_size,
                                      BlockHash parent) {
  std::vector<BlockHash> out;
  if (block_size <= 0) return out;
  const size_t n = tokens.size() / block_size;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    parent = HashBlock(parent, tokens.subspan(i * block_size, block_size));
    out.push_back(parent);
  }
  return out;
}

}  // namespace agentkv::cache
