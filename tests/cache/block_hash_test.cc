// Chain roots (salts): the empty salt is the unsalted chain, bit for bit
// what chains hashed to before salts existed (stored KV records are keyed
// by these hashes); any other salt changes every block's hash.
#include "cache/block_hash.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace agentkv::cache {
namespace {

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(3 + 7 * i);
  return v;
}

TEST(BlockHashTest, EmptySaltIsTheUnsaltedChain) {
  EXPECT_EQ(ChainRoot(""), kRootBlockHash);
  const std::vector<int32_t> t = Tokens(8);
  EXPECT_EQ(HashFullBlocks(t, 4, ChainRoot("")), HashFullBlocks(t, 4));
  // The hashes a build without salts computed for these tokens (the store
  // holds records under them): they must never change.
  const std::vector<BlockHash> h = HashFullBlocks(t, 4, ChainRoot(""));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], (BlockHash{0xd8bacf195d118c3eull, 0xea3179fdbeae1c76ull}));
  EXPECT_EQ(h[1], (BlockHash{0x5472e108540f0958ull, 0x82f812bb58095160ull}));
}

TEST(BlockHashTest, SaltsChangeEveryBlockHash) {
  const std::vector<int32_t> t = Tokens(16);
  const std::vector<BlockHash> plain = HashFullBlocks(t, 4);
  const std::vector<BlockHash> a = HashFullBlocks(t, 4, ChainRoot("3:acme"));
  const std::vector<BlockHash> a_again = HashFullBlocks(t, 4, ChainRoot("3:acme"));
  const std::vector<BlockHash> b = HashFullBlocks(t, 4, ChainRoot("4:zeta"));
  EXPECT_EQ(a, a_again);  // deterministic: a tenant's blocks are found again
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NE(a[i], plain[i]) << i;
    EXPECT_NE(a[i], b[i]) << i;
    EXPECT_NE(b[i], plain[i]) << i;
  }
  EXPECT_NE(ChainRoot("3:acme"), kRootBlockHash);
  EXPECT_NE(ChainRoot("a"), ChainRoot("b"));
  // Roots are domain-separated from block hashes: a salt spelling a block
  // hash's input (16 zero bytes: the root parent, no tokens) is not that
  // block's hash.
  EXPECT_NE(ChainRoot(std::string(16, '\0')), HashBlock(kRootBlockHash, {}));
}

}  // namespace
}  // namespace agentkv::cache
