// HostKvTier: LRU order, the byte bound, leases and reservations, and
// content addressing (a block is found only for its own chained prefix).
#include "engine/host_kv_tier.h"

#include <gtest/gtest.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "test_model.h"

namespace agentkv::engine {
namespace {

constexpr int kBs = 4;
constexpr size_t kBlockBytes = 64;

std::unique_ptr<backend::Backend> MakeBackend() {
  const model::ModelConfig c = testing::SmallConfig(model::Architecture::kLlama);
  auto b = backend::cpu::CpuBackend::Create(c, testing::RandomWeights(c, 3),
                                            backend::cpu::CpuBackendOptions{1});
  EXPECT_TRUE(b.ok());
  return std::move(b).value();
}

std::unique_ptr<HostKvTier> MakeTier(backend::Backend& backend, size_t capacity,
                                     size_t arena = 1 << 20) {
  HostKvTierOptions o;
  o.capacity_bytes = capacity;
  o.block_bytes = kBlockBytes;
  o.block_size = kBs;
  o.arena_bytes = arena;
  auto t = HostKvTier::Create(backend, o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

// A chain of `n` blocks: block i holds tokens 10 * i + {0..3} after a common
// `first` token value.
struct Chain {
  std::vector<int32_t> tokens;
  std::vector<cache::BlockHash> hashes;
};
Chain MakeChain(int n, int32_t first) {
  Chain c;
  for (int i = 0; i < n * kBs; ++i) c.tokens.push_back(first + i);
  c.hashes = cache::HashFullBlocks(c.tokens, kBs);
  return c;
}

std::vector<std::byte> Bytes(uint8_t v) {
  return std::vector<std::byte>(kBlockBytes, std::byte{v});
}

bool Put(HostKvTier& t, const Chain& c, int i, uint8_t v) {
  const cache::BlockHash parent = i == 0 ? cache::kRootBlockHash : c.hashes[i - 1];
  return t.Insert(parent, c.hashes[i],
                  std::span<const int32_t>(c.tokens).subspan(static_cast<size_t>(i) * kBs, kBs),
                  Bytes(v));
}

TEST(HostKvTierTest, RefusesACapacityBelowOneBlock) {
  auto backend = MakeBackend();
  HostKvTierOptions o;
  o.capacity_bytes = kBlockBytes - 1;
  o.block_bytes = kBlockBytes;
  o.block_size = kBs;
  auto t = HostKvTier::Create(*backend, o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostKvTierTest, EvictsLeastRecentlyUsedFirst) {
  auto backend = MakeBackend();
  auto t = MakeTier(*backend, 3 * kBlockBytes);
  const Chain a = MakeChain(1, 100), b = MakeChain(1, 200), c = MakeChain(1, 300),
              d = MakeChain(1, 400);
  ASSERT_TRUE(Put(*t, a, 0, 1));
  ASSERT_TRUE(Put(*t, b, 0, 2));
  ASSERT_TRUE(Put(*t, c, 0, 3));
  EXPECT_TRUE(t->Touch(a.hashes[0]));  // a is now the most recent; b the least
  ASSERT_TRUE(Put(*t, d, 0, 4));
  EXPECT_TRUE(t->Contains(a.hashes[0]));
  EXPECT_FALSE(t->Contains(b.hashes[0]));
  EXPECT_TRUE(t->Contains(c.hashes[0]));
  EXPECT_TRUE(t->Contains(d.hashes[0]));
  ASSERT_TRUE(Put(*t, b, 0, 2));  // c goes next
  EXPECT_FALSE(t->Contains(c.hashes[0]));
  EXPECT_EQ(t->Stats().evictions, 2);
}

TEST(HostKvTierTest, NeverHoldsMoreThanItsBytes) {
  auto backend = MakeBackend();
  // 5.5 blocks of capacity in arenas of 2 blocks: 5 slots over 3 arenas.
  auto t = MakeTier(*backend, 5 * kBlockBytes + kBlockBytes / 2, 2 * kBlockBytes);
  EXPECT_EQ(t->capacity_blocks(), 5);
  EXPECT_EQ(t->Stats().capacity_bytes, static_cast<int64_t>(5 * kBlockBytes));
  const Chain c = MakeChain(20, 1);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(Put(*t, c, i, static_cast<uint8_t>(i)));
    const HostKvTierStats s = t->Stats();
    EXPECT_LE(s.bytes, s.capacity_bytes);
    EXPECT_EQ(s.blocks, std::min(i + 1, 5));
  }
  // The last five stay, with their own bytes.
  auto hits = t->Match(c.tokens, 15, 5, c.hashes[14]);
  ASSERT_EQ(hits.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(hits[i].data[0], std::byte(15 + i));
  t->Release(hits);
}

TEST(HostKvTierTest, MatchFollowsTheChainAndChecksTokens) {
  auto backend = MakeBackend();
  auto t = MakeTier(*backend, 16 * kBlockBytes);
  const Chain c = MakeChain(4, 7);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put(*t, c, i, static_cast<uint8_t>(i + 1)));
  // From the start, and from the middle (with the right parent).
  EXPECT_EQ(t->Match(c.tokens, 0, 10, cache::kRootBlockHash).size(), 4u);
  EXPECT_EQ(t->Match(c.tokens, 2, 10, c.hashes[1]).size(), 2u);
  EXPECT_EQ(t->Match(c.tokens, 0, 3, cache::kRootBlockHash).size(), 3u);
  // Same tokens after another prefix hash to something else: no hit.
  EXPECT_TRUE(t->Match(c.tokens, 2, 10, cache::kRootBlockHash).empty());
  // A prompt that diverges in block 2 stops there.
  Chain other = c;
  other.tokens[9] = 999;
  EXPECT_EQ(t->Match(other.tokens, 0, 10, cache::kRootBlockHash).size(), 2u);
  // Leases were taken by every Match above; the tier still answers.
  EXPECT_EQ(t->Stats().hits, 4 + 2 + 3 + 2);
}

TEST(HostKvTierTest, LeasedAndReservedSlotsAreNotEvicted) {
  auto backend = MakeBackend();
  auto t = MakeTier(*backend, 2 * kBlockBytes);
  const Chain a = MakeChain(1, 100), b = MakeChain(1, 200), c = MakeChain(1, 300);
  ASSERT_TRUE(Put(*t, a, 0, 1));
  auto leased = t->Match(a.tokens, 0, 1, cache::kRootBlockHash);
  ASSERT_EQ(leased.size(), 1u);
  // b is reserved (a device read would be filling it): not served yet.
  HostKvTier::Slot slot = t->Reserve(cache::kRootBlockHash, b.hashes[0], b.tokens);
  ASSERT_FALSE(slot.empty());
  EXPECT_FALSE(t->Contains(b.hashes[0]));
  bool pending = false;
  EXPECT_TRUE(t->Match(b.tokens, 0, 1, cache::kRootBlockHash, &pending).empty());
  EXPECT_TRUE(pending);
  // Both slots are taken by a lease and a reservation: nothing can go.
  EXPECT_FALSE(Put(*t, c, 0, 3));
  EXPECT_TRUE(t->Contains(a.hashes[0]));
  std::fill(slot.begin(), slot.end(), std::byte{2});
  t->Commit(b.hashes[0]);
  EXPECT_TRUE(t->Contains(b.hashes[0]));
  auto hit_b = t->Match(b.tokens, 0, 1, cache::kRootBlockHash, &pending);
  EXPECT_EQ(hit_b.size(), 1u);
  EXPECT_FALSE(pending);
  t->Release(hit_b);
  t->Release(leased);
  // a is the least recently used and no longer leased.
  ASSERT_TRUE(Put(*t, c, 0, 3));
  EXPECT_FALSE(t->Contains(a.hashes[0]));
  EXPECT_TRUE(t->Contains(b.hashes[0]));
}

TEST(HostKvTierTest, AbortGivesTheSlotBack) {
  auto backend = MakeBackend();
  auto t = MakeTier(*backend, kBlockBytes);
  const Chain a = MakeChain(1, 100), b = MakeChain(1, 200);
  ASSERT_FALSE(t->Reserve(cache::kRootBlockHash, a.hashes[0], a.tokens).empty());
  // The only slot is reserved; the same hash cannot be reserved twice.
  EXPECT_TRUE(t->Reserve(cache::kRootBlockHash, a.hashes[0], a.tokens).empty());
  EXPECT_FALSE(Put(*t, b, 0, 2));
  t->Abort(a.hashes[0]);
  EXPECT_FALSE(t->Contains(a.hashes[0]));
  EXPECT_TRUE(Put(*t, b, 0, 2));
  EXPECT_EQ(t->Stats().blocks, 1);
}

TEST(HostKvTierTest, RefusesWrongSizes) {
  auto backend = MakeBackend();
  auto t = MakeTier(*backend, 4 * kBlockBytes);
  const Chain a = MakeChain(1, 100);
  EXPECT_FALSE(t->Insert(cache::kRootBlockHash, a.hashes[0], a.tokens,
                         std::vector<std::byte>(kBlockBytes - 1)));
  EXPECT_TRUE(t->Reserve(cache::kRootBlockHash, a.hashes[0], std::span(a.tokens).first(3)).empty());
  EXPECT_EQ(t->Stats().blocks, 0);
}

}  // namespace
}  // namespace agentkv::engine
