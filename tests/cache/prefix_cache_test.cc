#include "cache/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace agentkv::cache {
namespace {

constexpr int kBs = 4;

std::vector<int32_t> Iota(int n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Allocates one block per full block of `tokens`, registers them in order and
// returns the blocks (still referenced).
std::vector<int32_t> Register(BlockPool& pool, PrefixCache& cache,
                              const std::vector<int32_t>& tokens) {
  std::vector<int32_t> blocks;
  BlockHash parent = kRootBlockHash;
  std::span<const int32_t> all(tokens);
  for (const BlockHash& h : HashFullBlocks(tokens, kBs)) {
    int32_t b = *pool.Allocate();
    EXPECT_TRUE(cache.Insert(parent, h, all.subspan(blocks.size() * kBs, kBs), b));
    blocks.push_back(b);
    parent = h;
  }
  return blocks;
}

TEST(BlockHashTest, ChainsOverTheParent) {
  std::vector<int32_t> t = Iota(kBs);
  BlockHash h1 = HashBlock(kRootBlockHash, t);
  EXPECT_EQ(h1, HashBlock(kRootBlockHash, t));
  EXPECT_NE(h1, HashBlock(h1, t));  // same tokens, different prefix
  std::vector<int32_t> u = t;
  u[3] = 99;
  EXPECT_NE(h1, HashBlock(kRootBlockHash, u));
  std::vector<int32_t> two = Iota(2 * kBs + 3);
  std::vector<BlockHash> hs = HashFullBlocks(two, kBs);
  ASSERT_EQ(hs.size(), 2u);  // trailing partial block not hashed
  EXPECT_EQ(hs[0], HashBlock(kRootBlockHash, std::span<const int32_t>(two).first(kBs)));
  EXPECT_EQ(hs[1], HashBlock(hs[0], std::span<const int32_t>(two).subspan(kBs, kBs)));
}

TEST(PrefixCacheTest, AcquiresLongestCachedPrefixWithReferences) {
  BlockPool pool(8);
  PrefixCache cache(&pool, kBs);
  std::vector<int32_t> a = Iota(3 * kBs + 1);
  std::vector<int32_t> blocks = Register(pool, cache, a);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(cache.size(), 3u);

  std::vector<int32_t> q = a;
  q[2 * kBs + 1] = 1000;  // diverges inside the third block
  EXPECT_EQ(cache.CountCached(q, kRootBlockHash), 2);
  std::vector<BlockHash> hashes;
  std::vector<int32_t> got = cache.Acquire(q, kRootBlockHash, 10, &hashes);
  EXPECT_EQ(got, (std::vector<int32_t>{blocks[0], blocks[1]}));
  EXPECT_EQ(hashes.size(), 2u);
  EXPECT_EQ(pool.RefCount(blocks[0]), 2);
  EXPECT_EQ(pool.RefCount(blocks[2]), 1);
  EXPECT_EQ(pool.Stats().prefix_hits, 2);
  EXPECT_EQ(pool.Stats().prefix_misses, 1);

  // max_blocks caps the match.
  std::vector<int32_t> one = cache.Acquire(a, kRootBlockHash, 1);
  EXPECT_EQ(one, (std::vector<int32_t>{blocks[0]}));
  // A different first block matches nothing, even if later blocks are equal.
  std::vector<int32_t> r = a;
  r[0] = 1000;
  EXPECT_TRUE(cache.Acquire(r, kRootBlockHash, 10).empty());
}

TEST(PrefixCacheTest, EvictionRemovesEntries) {
  BlockPool pool(3);
  PrefixCache cache(&pool, kBs);
  std::vector<int32_t> a = Iota(3 * kBs);
  std::vector<int32_t> blocks = Register(pool, cache, a);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) pool.Release(*it);
  EXPECT_EQ(pool.Stats().cached, 3);
  EXPECT_EQ(cache.CountCached(a, kRootBlockHash), 3);
  // Tail released first -> evicted first; the head survives.
  ASSERT_TRUE(pool.Allocate().ok());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.CountCached(a, kRootBlockHash), 2);
  ASSERT_TRUE(pool.Allocate().ok());
  EXPECT_EQ(cache.CountCached(a, kRootBlockHash), 1);
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST(PrefixCacheTest, StoredTokensAreVerifiedBeforeReuse) {
  BlockPool pool(4);
  PrefixCache cache(&pool, kBs);
  std::vector<int32_t> real = Iota(kBs);
  std::vector<int32_t> other = Iota(kBs, 50);
  // Simulate a hash collision: `other`'s content filed under `real`'s hash.
  int32_t b = *pool.Allocate();
  ASSERT_TRUE(cache.Insert(kRootBlockHash, HashBlock(kRootBlockHash, real), other, b));
  EXPECT_EQ(cache.CountCached(real, kRootBlockHash), 0);
  EXPECT_TRUE(cache.Acquire(real, kRootBlockHash, 1).empty());
  EXPECT_EQ(pool.RefCount(b), 1);
}

TEST(PrefixCacheTest, InsertRejectsDuplicatesAndBadBlocks) {
  BlockPool pool(4);
  PrefixCache cache(&pool, kBs);
  std::vector<int32_t> t = Iota(kBs);
  BlockHash h = HashBlock(kRootBlockHash, t);
  int32_t a = *pool.Allocate(), b = *pool.Allocate();
  EXPECT_TRUE(cache.Insert(kRootBlockHash, h, t, a));
  EXPECT_FALSE(cache.Insert(kRootBlockHash, h, t, b));  // same content computed twice
  EXPECT_FALSE(pool.IsCached(b));
  EXPECT_FALSE(cache.Insert(h, HashBlock(h, t), t, a));  // a already holds an entry
  EXPECT_FALSE(cache.Insert(kRootBlockHash, HashBlock(h, t), Iota(kBs - 1), b));  // short
  pool.Release(b);
  EXPECT_FALSE(cache.Insert(kRootBlockHash, HashBlock(h, t), t, b));  // unreferenced
  EXPECT_EQ(cache.Find(h), a);
  EXPECT_TRUE(cache.CheckInvariants().ok());
}

TEST(PrefixCacheTest, ClearFreesIdleBlocks) {
  BlockPool pool(4);
  PrefixCache cache(&pool, kBs);
  std::vector<int32_t> blocks = Register(pool, cache, Iota(2 * kBs));
  pool.Release(blocks[1]);
  cache.Clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(pool.Stats().free, 3);
  pool.Release(blocks[0]);  // no longer cached: straight to the free list
  EXPECT_EQ(pool.Stats().free, 4);
  EXPECT_TRUE(cache.CheckInvariants().ok());
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// The evict observer sees what an evicted block holds (its hash, parent and
// tokens) before the entry goes; Clear is not an eviction.
TEST(PrefixCacheTest, EvictObserverSeesWhatTheBlockHeld) {
  BlockPool pool(4);
  PrefixCache cache(&pool, kBs);
  struct Seen {
    int32_t block;
    BlockHash hash, parent;
    std::vector<int32_t> tokens;
    bool still_found;
  };
  std::vector<Seen> seen;
  cache.SetEvictObserver([&](int32_t block, const BlockHash& hash, const BlockHash& parent,
                             std::span<const int32_t> tokens) {
    seen.push_back(Seen{block, hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end()),
                        cache.Find(hash).has_value()});
  });
  const std::vector<int32_t> t = Iota(2 * kBs, 10);
  const std::vector<BlockHash> h = HashFullBlocks(t, kBs);
  std::vector<int32_t> blocks = Register(pool, cache, t);
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool.Release(*b);  // tail first
  EXPECT_EQ(pool.EvictIdle(1), 1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].block, blocks[1]);
  EXPECT_EQ(seen[0].hash, h[1]);
  EXPECT_EQ(seen[0].parent, h[0]);
  EXPECT_EQ(seen[0].tokens, std::vector<int32_t>(t.begin() + kBs, t.end()));
  EXPECT_TRUE(seen[0].still_found);  // called before the entry goes
  EXPECT_FALSE(cache.Find(h[1]).has_value());
  cache.Clear();
  EXPECT_EQ(seen.size(), 1u);
  cache.SetEvictObserver(nullptr);
  ASSERT_TRUE(cache.CheckInvariants().ok());
}

}  // namespace
}  // namespace agentkv::cache
