#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace agentkv::cache {
namespace {

int32_t Alloc(BlockPool& pool) {
  Result<int32_t> b = pool.Allocate();
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? *b : -1;
}

TEST(BlockPoolTest, AllocatesDistinctBlocksUntilExhausted) {
  BlockPool pool(4);
  std::set<int32_t> ids;
  for (int i = 0; i < 4; ++i) ids.insert(Alloc(pool));
  EXPECT_EQ(ids, (std::set<int32_t>{0, 1, 2, 3}));
  Result<int32_t> none = pool.Allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.Stats().in_use, 4);
  EXPECT_EQ(pool.Stats().free, 0);
  pool.Release(2);
  EXPECT_EQ(Alloc(pool), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, ReferenceCounting) {
  BlockPool pool(2);
  int32_t b = Alloc(pool);
  pool.AddRef(b);
  EXPECT_EQ(pool.RefCount(b), 2);
  pool.Release(b);
  EXPECT_EQ(pool.RefCount(b), 1);
  EXPECT_EQ(pool.Stats().free, 1);
  pool.Release(b);
  EXPECT_EQ(pool.RefCount(b), 0);
  EXPECT_EQ(pool.Stats().free, 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, EvictsCachedBlocksLeastRecentlyReleasedFirst) {
  BlockPool pool(3);
  std::vector<int32_t> evicted;
  pool.SetEvictCallback([&](int32_t b) { evicted.push_back(b); });
  int32_t a = Alloc(pool), b = Alloc(pool), c = Alloc(pool);
  for (int32_t x : {a, b, c}) ASSERT_TRUE(pool.MarkCached(x));
  pool.Release(b);
  pool.Release(a);
  pool.Release(c);
  EXPECT_EQ(pool.Stats().cached, 3);
  EXPECT_EQ(pool.Stats().free, 0);
  // Reviving `b` moves it to the most recently used end.
  pool.AddRef(b);
  pool.Release(b);
  EXPECT_EQ(Alloc(pool), a);
  EXPECT_EQ(Alloc(pool), c);
  EXPECT_EQ(Alloc(pool), b);
  EXPECT_EQ(evicted, (std::vector<int32_t>{a, c, b}));
  EXPECT_EQ(pool.Stats().evictions, 3);
  EXPECT_FALSE(pool.IsCached(a));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, ReferencedCachedBlocksAreNeverEvicted) {
  BlockPool pool(2);
  int32_t a = Alloc(pool), b = Alloc(pool);
  ASSERT_TRUE(pool.MarkCached(a));
  ASSERT_TRUE(pool.MarkCached(b));
  pool.Release(a);
  pool.AddRef(a);  // a prefix hit takes it back
  Result<int32_t> none = pool.Allocate();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.IsCached(a));
  EXPECT_TRUE(pool.IsCached(b));
  EXPECT_EQ(pool.Stats().evictions, 0);
}

TEST(BlockPoolTest, PinnedBlocksAreEvictedAfterPlainCachedOnes) {
  BlockPool pool(3);
  int32_t a = Alloc(pool), b = Alloc(pool), c = Alloc(pool);
  for (int32_t x : {a, b, c}) ASSERT_TRUE(pool.MarkCached(x));
  std::optional<PinRef> pin = pool.Pin(a);
  ASSERT_TRUE(pin.has_value());
  pool.Release(a);  // oldest, but pinned
  pool.Release(b);
  pool.Release(c);
  BlockPoolStats s = pool.Stats();
  EXPECT_EQ(s.pinned, 1);
  EXPECT_EQ(s.cached, 2);
  EXPECT_EQ(Alloc(pool), b);
  EXPECT_EQ(Alloc(pool), c);
  EXPECT_TRUE(pool.IsPinValid(*pin));
  EXPECT_EQ(Alloc(pool), a);  // under pressure the pinned tier goes too
  EXPECT_FALSE(pool.IsPinValid(*pin));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, UnpinMovesBlockBackToPlainTier) {
  BlockPool pool(2);
  int32_t a = Alloc(pool), b = Alloc(pool);
  ASSERT_TRUE(pool.MarkCached(a));
  ASSERT_TRUE(pool.MarkCached(b));
  PinRef pin = *pool.Pin(b);
  pool.Release(b);
  pool.Release(a);
  pool.Unpin(pin);  // b becomes plain cached, most recent
  EXPECT_EQ(pool.Stats().pinned, 0);
  EXPECT_EQ(pool.Stats().cached, 2);
  EXPECT_EQ(Alloc(pool), a);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, StalePinDoesNotTouchTheReusedBlock) {
  BlockPool pool(1);
  int32_t a = Alloc(pool);
  ASSERT_TRUE(pool.MarkCached(a));
  PinRef stale = *pool.Pin(a);
  pool.Release(a);
  ASSERT_EQ(Alloc(pool), a);  // evicted and reused
  ASSERT_TRUE(pool.MarkCached(a));
  PinRef fresh = *pool.Pin(a);
  EXPECT_FALSE(pool.IsPinValid(stale));
  EXPECT_TRUE(pool.IsPinValid(fresh));
  pool.Unpin(stale);  // must not drop the fresh pin
  pool.Release(a);
  EXPECT_EQ(pool.Stats().pinned, 1);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, PinRequiresCachedBlock) {
  BlockPool pool(1);
  int32_t a = Alloc(pool);
  EXPECT_FALSE(pool.Pin(a).has_value());
  pool.Release(a);
  EXPECT_FALSE(pool.MarkCached(a));  // free blocks cannot be cached
}

TEST(BlockPoolTest, EvictIdleAndUncache) {
  BlockPool pool(4);
  std::vector<int32_t> evicted;
  pool.SetEvictCallback([&](int32_t b) { evicted.push_back(b); });
  std::vector<int32_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(Alloc(pool));
  for (int32_t x : ids) ASSERT_TRUE(pool.MarkCached(x));
  for (int32_t x : ids) pool.Release(x);
  EXPECT_EQ(pool.EvictIdle(2), 2);
  EXPECT_EQ(evicted, (std::vector<int32_t>{ids[0], ids[1]}));
  pool.Uncache(ids[2]);  // the prefix cache's own removal: no callback
  EXPECT_EQ(evicted.size(), 2u);
  BlockPoolStats s = pool.Stats();
  EXPECT_EQ(s.free, 3);
  EXPECT_EQ(s.cached, 1);
  EXPECT_EQ(pool.EvictIdle(10), 1);
  EXPECT_EQ(pool.Stats().free, 4);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, StatsPartitionTheBlocks) {
  BlockPool pool(6);
  std::vector<int32_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Alloc(pool));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.MarkCached(ids[i]));
  pool.Pin(ids[0]);
  for (int i = 0; i < 4; ++i) pool.Release(ids[i]);  // ids[3] uncached -> free
  pool.RecordPrefixLookup(3, 2);
  BlockPoolStats s = pool.Stats();
  EXPECT_EQ(s.total, 6);
  EXPECT_EQ(s.in_use, 1);
  EXPECT_EQ(s.pinned, 1);
  EXPECT_EQ(s.cached, 2);
  EXPECT_EQ(s.free, 2);
  EXPECT_EQ(s.prefix_hits, 3);
  EXPECT_EQ(s.prefix_misses, 2);
  EXPECT_EQ(pool.NumAvailable(), 5);
}

#ifdef NDEBUG
TEST(BlockPoolTest, DoubleReleaseIsReportedNotApplied) {
  BlockPool pool(2);
  int32_t a = Alloc(pool);
  pool.Release(a);
  pool.Release(a);
  EXPECT_EQ(pool.Stats().free, 2);  // not pushed twice
  Status st = pool.CheckInvariants();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
}
#else
TEST(BlockPoolDeathTest, DoubleReleaseAsserts) {
  BlockPool pool(2);
  int32_t a = Alloc(pool);
  pool.Release(a);
  EXPECT_DEATH(pool.Release(a), "misuse");
}
#endif

}  // namespace
}  // namespace agentkv::cache
