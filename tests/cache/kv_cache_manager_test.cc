#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "test_specs.h"

namespace agentkv::cache {
namespace {

using testing::FullSpec;
using testing::SlidingSpec;

constexpr int kBs = 4;

std::vector<int32_t> Iota(int n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::unique_ptr<KvCacheManager> Make(const ModelCacheSpec& spec, std::vector<int32_t> blocks) {
  KvCacheConfig cfg;
  cfg.block_size = kBs;
  cfg.blocks_per_group = std::move(blocks);
  auto m = KvCacheManager::Create(spec, cfg);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

// Reserves room for `tokens` after what the sequence has and commits them.
void Append(KvCacheManager& m, KvCacheManager::SeqId id, const std::vector<int32_t>& tokens,
            std::vector<KvBlockCopy>* copies = nullptr) {
  std::vector<KvBlockCopy> local;
  ASSERT_TRUE(m.EnsureCapacity(id, m.NumTokens(id) + tokens.size(), copies ? copies : &local).ok());
  ASSERT_TRUE(m.CommitTokens(id, tokens).ok());
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
}

std::vector<int32_t> Head(const std::vector<int32_t>& v, size_t n) {
  return {v.begin(), v.begin() + n};
}

TEST(KvCacheManagerTest, CreateValidatesConfig) {
  KvCacheConfig cfg;
  cfg.block_size = kBs;
  cfg.blocks_per_group = {4, 4};  // FullSpec has one group
  EXPECT_EQ(KvCacheManager::Create(FullSpec(), cfg).status().code(), StatusCode::kInvalidArgument);
  cfg.blocks_per_group = {0};
  EXPECT_FALSE(KvCacheManager::Create(FullSpec(), cfg).ok());
  cfg.blocks_per_group = {4};
  cfg.block_size = 0;
  EXPECT_FALSE(KvCacheManager::Create(FullSpec(), cfg).ok());
}

// Sequences of different chain roots (tenants' salts) never share a block,
// even with identical tokens: nothing is attached, counted or restored
// across roots; the same root still shares.
TEST(KvCacheManagerTest, SaltedChainsShareNoBlocks) {
  auto m = Make(FullSpec(), {32});
  const BlockHash acme = ChainRoot("4:acme");
  const BlockHash zeta = ChainRoot("4:zeta");
  const std::vector<int32_t> p = Iota(3 * kBs + 1);
  ASSERT_TRUE(m->AddSequence(1, acme).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(1, p), 0);
  Append(*m, 1, p);
  m->FreeSequence(1);
  EXPECT_EQ(m->CachedPrefixTokens(p, acme), 3 * kBs);
  EXPECT_EQ(m->CachedPrefixTokens(p, zeta), 0);
  EXPECT_EQ(m->CachedPrefixTokens(p, kRootBlockHash), 0);

  ASSERT_TRUE(m->AddSequence(2, zeta).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(2, p), 0);
  Append(*m, 2, p);
  ASSERT_TRUE(m->AddSequence(3).ok());  // unsalted
  EXPECT_EQ(*m->AttachCachedPrefix(3, p), 0);
  ASSERT_TRUE(m->AddSequence(4, acme).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(4, p), 3 * kBs);
  for (int i = 0; i < 3; ++i) EXPECT_NE(m->Table(2, 0).blocks()[i], m->Table(4, 0).blocks()[i]);
  EXPECT_EQ(m->BlockHashes(4), HashFullBlocks(std::span(p).first(3 * kBs), kBs, acme));

  // A restore of acme's hashes into zeta's chain does not match its chain.
  m->FreeSequence(2);
  m->FreeSequence(3);
  m->FreeSequence(4);
  ASSERT_EQ(m->EvictIdle(0, 1000), 6);
  const std::vector<BlockHash> acme_hashes = HashFullBlocks(std::span(p).first(3 * kBs), kBs, acme);
  auto ok = [](size_t, int32_t) { return Status::Ok(); };
  EXPECT_EQ(m->RestoreBlocks(p, zeta, 0, acme_hashes, ok), 0);
  EXPECT_EQ(m->RestoreHeldBlocks(9, p, zeta, 0, acme_hashes, ok), 0);
  EXPECT_EQ(m->RestoreBlocks(p, acme, 0, acme_hashes, ok), 3);
  EXPECT_EQ(m->CachedPrefixTokens(p, acme), 3 * kBs);
  EXPECT_EQ(m->CachedPrefixTokens(p, zeta), 0);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

TEST(KvCacheManagerTest, AllocatesOnDemand) {
  auto m = Make(FullSpec(), {8});
  ASSERT_TRUE(m->AddSequence(1).ok());
  EXPECT_EQ(m->NewBlocksNeeded(1, 9, 0), 3);
  Append(*m, 1, Iota(5));
  EXPECT_EQ(m->Table(1, 0).size(), 2);
  Append(*m, 1, Iota(3));
  EXPECT_EQ(m->Table(1, 0).size(), 2);  // 8 tokens still fit
  Append(*m, 1, Iota(1));
  EXPECT_EQ(m->Table(1, 0).size(), 3);
  EXPECT_EQ(m->NumTokens(1), 9);
  EXPECT_EQ(m->Stats(0).in_use, 3);
  // Committing past the reservation is refused.
  EXPECT_EQ(m->CommitTokens(1, Iota(4)).code(), StatusCode::kInvalidArgument);
  m->FreeSequence(1);
  EXPECT_EQ(m->Stats(0).in_use, 0);
  EXPECT_EQ(m->Stats(0).cached, 2);  // the two full blocks
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvCacheManagerTest, CommonPrefixSharesPhysicalBlocks) {
  auto m = Make(FullSpec(), {16});
  std::vector<int32_t> a = Iota(3 * kBs + 2);
  std::vector<int32_t> b = Head(a, 3 * kBs);
  for (int32_t t : {100, 101, 102, 103, 104}) b.push_back(t);

  ASSERT_TRUE(m->AddSequence(1).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(1, a), 0);
  Append(*m, 1, a);

  ASSERT_TRUE(m->AddSequence(2).ok());
  EXPECT_EQ(m->CachedPrefixTokens(b, kRootBlockHash), 3 * kBs);
  Result<int64_t> hit = m->AttachCachedPrefix(2, b);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 3 * kBs);
  EXPECT_EQ(m->NumTokens(2), 3 * kBs);
  Append(*m, 2, {b.begin() + 3 * kBs, b.end()});

  const auto& ta = m->Table(1, 0).blocks();
  const auto& tb = m->Table(2, 0).blocks();
  ASSERT_EQ(tb.size(), 5u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ta[i], tb[i]) << i;
    EXPECT_EQ(m->pool(0).RefCount(ta[i]), 2);
  }
  EXPECT_NE(ta[3], tb[3]);
  EXPECT_EQ(m->BlockHashes(1)[2], m->BlockHashes(2)[2]);
  EXPECT_EQ(m->Stats(0).prefix_hits, 3);
  EXPECT_EQ(m->Stats(0).in_use, 4 + 2);
}

TEST(KvCacheManagerTest, FullyCachedPromptStillComputesItsLastToken) {
  auto m = Make(FullSpec(), {8});
  std::vector<int32_t> p = Iota(2 * kBs);
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, p);
  m->FreeSequence(1);
  ASSERT_TRUE(m->AddSequence(2).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(2, p), kBs);
  EXPECT_EQ(m->AttachCachedPrefix(2, p).status().code(), StatusCode::kInvalidArgument);
}

TEST(KvCacheManagerTest, CopyOnWriteOfSharedPartialBlock) {
  auto m = Make(FullSpec(), {8});
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Iota(kBs + 2));  // one full block and a partial one
  ASSERT_TRUE(m->Fork(1, 2).ok());
  const int32_t full = m->Table(1, 0).blocks()[0];
  const int32_t partial = m->Table(1, 0).blocks()[1];
  EXPECT_EQ(m->Table(2, 0).blocks(), m->Table(1, 0).blocks());
  EXPECT_EQ(m->pool(0).RefCount(partial), 2);

  std::vector<KvBlockCopy> copies;
  Append(*m, 2, {50}, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].group, 0);
  EXPECT_EQ(copies[0].src, partial);
  const int32_t dst = copies[0].dst;
  EXPECT_NE(dst, partial);
  EXPECT_EQ(m->Table(2, 0).blocks(), (std::vector<int32_t>{full, dst}));
  EXPECT_EQ(m->Table(1, 0).blocks(), (std::vector<int32_t>{full, partial}));

  // The source stays alive for the pending copy even if its owner goes.
  m->FreeSequence(1);
  EXPECT_EQ(m->pool(0).RefCount(partial), 1);
  EXPECT_TRUE(m->CheckInvariants().ok());
  m->CopiesDone();
  EXPECT_EQ(m->pool(0).RefCount(partial), 0);

  // Now exclusive: appending copies nothing.
  copies.clear();
  Append(*m, 2, {51}, &copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvCacheManagerTest, ForkAtBlockBoundaryCopiesNothing) {
  auto m = Make(FullSpec(), {8});
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Iota(2 * kBs));
  ASSERT_TRUE(m->Fork(1, 2).ok());
  std::vector<KvBlockCopy> copies;
  Append(*m, 1, {7}, &copies);
  Append(*m, 2, {8}, &copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_NE(m->Table(1, 0).blocks()[2], m->Table(2, 0).blocks()[2]);
  EXPECT_EQ(m->Table(1, 0).blocks()[1], m->Table(2, 0).blocks()[1]);
}

TEST(KvCacheManagerTest, ResourceExhaustedLeavesSequenceUnchanged) {
  auto m = Make(FullSpec(), {4});
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Iota(3 * kBs));
  ASSERT_TRUE(m->AddSequence(2).ok());
  std::vector<KvBlockCopy> copies;
  Status st = m->EnsureCapacity(2, 2 * kBs, &copies);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(m->Table(2, 0).size(), 0);
  EXPECT_EQ(m->Stats(0).free, 1);
  // With every block referenced, not even one more block is available.
  ASSERT_TRUE(m->EnsureCapacity(2, kBs, &copies).ok());
  EXPECT_EQ(m->EnsureCapacity(2, kBs + 1, &copies).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(m->EvictIdle(0, 10), 0);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvCacheManagerTest, EvictsLeastRecentlyUsedPrefixFirst) {
  auto m = Make(FullSpec(), {6});
  std::vector<int32_t> a = Iota(3 * kBs), b = Iota(3 * kBs, 100);
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, a);
  ASSERT_TRUE(m->AddSequence(2).ok());
  Append(*m, 2, b);
  m->FreeSequence(1);  // a is older
  m->FreeSequence(2);
  EXPECT_EQ(m->Stats(0).cached, 6);
  ASSERT_TRUE(m->AddSequence(3).ok());
  Append(*m, 3, Iota(2 * kBs, 500));
  // a's two tail blocks went, b is intact.
  EXPECT_EQ(m->CachedPrefixTokens(a, kRootBlockHash), kBs);
  EXPECT_EQ(m->CachedPrefixTokens(b, kRootBlockHash),
            2 * kBs);  // whole prompt: last block recomputed
  std::vector<int32_t> b_longer = b;
  b_longer.push_back(1);
  EXPECT_EQ(m->CachedPrefixTokens(b_longer, kRootBlockHash), 3 * kBs);
  EXPECT_EQ(m->Stats(0).evictions, 2);
}

TEST(KvCacheManagerTest, ResidentAgentCacheIsEvictedAfterPlainCache) {
  auto m = Make(FullSpec(), {6});
  std::vector<int32_t> agent = Iota(3 * kBs + 1), other = Iota(3 * kBs, 100);
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, agent);
  AgentCache cache = m->PinForAgent(1);
  EXPECT_EQ(cache.pins.size(), 3u);
  m->FreeSequence(1);  // agent's turn ends first: its blocks are the oldest
  ASSERT_TRUE(m->AddSequence(2).ok());
  Append(*m, 2, other);
  m->FreeSequence(2);
  EXPECT_EQ(m->Stats(0).pinned, 3);
  EXPECT_EQ(m->Stats(0).cached, 3);
  EXPECT_EQ(m->ResidentTokens(cache), 3 * kBs);

  // Pressure takes the plain cached blocks first...
  ASSERT_TRUE(m->AddSequence(3).ok());
  Append(*m, 3, Iota(3 * kBs, 500));
  EXPECT_EQ(m->ResidentTokens(cache), 3 * kBs);
  // ...then the agent's, tail first.
  Append(*m, 3, Iota(kBs, 600));
  EXPECT_EQ(m->ResidentTokens(cache), 2 * kBs);
  m->FreeSequence(3);

  // Next turn: the surviving head is found by content.
  std::vector<int32_t> turn2 = agent;
  turn2.push_back(9);
  ASSERT_TRUE(m->AddSequence(4).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(4, turn2), 2 * kBs);
  Append(*m, 4, {turn2.begin() + 2 * kBs, turn2.end()});
  AgentCache next = m->PinForAgent(4);
  m->ReleaseAgentCache(&cache);
  EXPECT_TRUE(cache.empty());
  EXPECT_EQ(m->ResidentTokens(next), 3 * kBs);
  m->FreeSequence(4);
  EXPECT_EQ(m->Stats(0).pinned, 3);
  m->ReleaseAgentCache(&next);
  EXPECT_EQ(m->Stats(0).pinned, 0);
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvCacheManagerTest, SlidingRingNeverExceedsRingBlocks) {
  const ModelCacheSpec spec = SlidingSpec(/*window=*/8);
  ASSERT_EQ(spec.groups.size(), 2u);
  ASSERT_EQ(spec.groups[0].kind, AttentionKind::kSliding);
  const int ring = spec.RingBlocks(0, kBs);
  ASSERT_EQ(ring, 3);
  auto m = Make(spec, {8, 64});
  EXPECT_FALSE(m->prefix_caching());
  ASSERT_TRUE(m->AddSequence(1).ok());
  std::vector<int32_t> ring_blocks_seen;
  for (int i = 0; i < 100; ++i) {
    Append(*m, 1, {i});
    const BlockTable& t = m->Table(1, 0);
    ASSERT_LE(t.size(), ring);
    ASSERT_EQ(m->Stats(0).in_use, t.size());
    // The token just written is where the backend will look for it.
    ASSERT_EQ(t.BlockAt(i), t.blocks()[(i / kBs) % ring]);
  }
  EXPECT_EQ(m->Table(1, 1).size(), 25);
  // A big chunk still fits in the ring.
  Append(*m, 1, Iota(50));
  EXPECT_EQ(m->Table(1, 0).size(), ring);
  EXPECT_EQ(m->Stats(0).in_use, ring);
}

TEST(KvCacheManagerTest, SlidingModelsDoNotReusePrefixes) {
  auto m = Make(SlidingSpec(8), {8, 16});
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Iota(3 * kBs));
  // The hash chain is still kept (the store keys blocks by it).
  EXPECT_EQ(m->BlockHashes(1).size(), 3u);
  AgentCache cache = m->PinForAgent(1);
  EXPECT_TRUE(cache.empty());
  m->FreeSequence(1);
  EXPECT_EQ(m->Stats(1).cached, 0);
  EXPECT_EQ(m->Stats(1).free, 16);
  ASSERT_TRUE(m->AddSequence(2).ok());
  EXPECT_EQ(*m->AttachCachedPrefix(2, Iota(3 * kBs + 1)), 0);
}

TEST(KvCacheManagerTest, ForkedRingCopiesSlotsOnWrite) {
  auto m = Make(SlidingSpec(8), {8, 16});
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Iota(2 * kBs + 1));  // ring slots 0, 1 full, 2 partial
  ASSERT_TRUE(m->Fork(1, 2).ok());
  auto count = [](const std::vector<KvBlockCopy>& copies, int group) {
    int n = 0;
    for (const KvBlockCopy& c : copies) n += c.group == group;
    return n;
  };
  std::vector<KvBlockCopy> copies;
  Append(*m, 2, {7}, &copies);
  EXPECT_EQ(count(copies, 0), 1);  // ring slot 2, the partial block
  EXPECT_EQ(count(copies, 1), 1);  // full group's partial block
  // Logical block 3 lands on ring slot 0, still shared and holding tokens the
  // step's attention may read: copied, not just replaced.
  copies.clear();
  Append(*m, 2, {1, 2, 3}, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].group, 0);
  EXPECT_EQ(copies[0].src, m->Table(1, 0).blocks()[0]);
  EXPECT_EQ(copies[0].dst, m->Table(2, 0).blocks()[0]);
  const auto& t2 = m->Table(2, 0).blocks();
  EXPECT_EQ(m->pool(0).RefCount(t2[0]), 1);
  EXPECT_EQ(m->pool(0).RefCount(t2[1]), 2);  // never written since the fork
  EXPECT_EQ(m->pool(0).RefCount(t2[2]), 1);
  m->CopiesDone();
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvCacheManagerTest, SplitRestoreHoldsTheTailUntilTheHeadIsComputed) {
  // 5 full blocks then one token: the head (blocks 0-1) is recomputed by
  // sequence 1 while blocks 2-4 come from a tier, held.
  auto m = Make(FullSpec(), {12});
  const std::vector<int32_t> prompt = Iota(5 * kBs + 1, 100);
  const std::vector<BlockHash> all =
      HashFullBlocks(std::span<const int32_t>(prompt).first(5 * kBs), kBs);
  std::vector<int32_t> written;
  const int32_t n = m->RestoreHeldBlocks(/*hold=*/7, prompt, kRootBlockHash, 2,
                                         std::span<const BlockHash>(all).subspan(2, 3),
                                         [&](size_t i, int32_t block) {
                                           EXPECT_EQ(i, written.size());
                                           written.push_back(block);
                                           return Status::Ok();
                                         });
  ASSERT_EQ(n, 3);
  EXPECT_EQ(written.size(), 3u);
  EXPECT_EQ(m->held_blocks(), 3);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  // Nothing is attachable from the start yet: the head is missing.
  EXPECT_EQ(m->CachedPrefixTokens(prompt, kRootBlockHash), 0);
  // Held blocks survive pressure: the other 9 blocks are all that is left.
  ASSERT_TRUE(m->AddSequence(2).ok());
  Append(*m, 2, Iota(9 * kBs, 5000));
  std::vector<KvBlockCopy> copies;
  EXPECT_FALSE(m->EnsureCapacity(2, 10 * kBs, &copies).ok());
  m->FreeSequence(2);
  // Sequence 1 computes the head, stops at block 2 and attaches the rest.
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Head(prompt, 2 * kBs));
  auto attached = m->AttachCachedContinuation(1, prompt);
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  EXPECT_EQ(*attached, 3 * kBs);
  EXPECT_EQ(m->NumTokens(1), 5 * kBs);
  EXPECT_EQ(
      std::vector<int32_t>(m->Table(1, 0).blocks().begin() + 2, m->Table(1, 0).blocks().end()),
      written);
  EXPECT_EQ(m->BlockHashes(1), all);
  m->ReleaseHold(7);
  EXPECT_EQ(m->held_blocks(), 0);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  // The last token is computed as usual; the chain is whole afterwards.
  Append(*m, 1, {prompt.back()});
  m->FreeSequence(1);
  EXPECT_EQ(m->CachedPrefixTokens(prompt, kRootBlockHash), 5 * kBs);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

TEST(KvCacheManagerTest, SplitRestoreStopsAtAWrongHashOrAFailedWrite) {
  auto m = Make(FullSpec(), {8});
  const std::vector<int32_t> prompt = Iota(4 * kBs, 1);
  std::vector<BlockHash> all = HashFullBlocks(prompt, kBs);
  std::vector<BlockHash> wrong(all.begin() + 1, all.end());
  wrong[1] = all[0];  // block 2 under block 0's hash
  auto ok = [](size_t, int32_t) { return Status::Ok(); };
  EXPECT_EQ(m->RestoreHeldBlocks(1, prompt, kRootBlockHash, 1, wrong, ok), 1);
  int calls = 0;
  auto fail_second = [&](size_t, int32_t) {
    return ++calls == 2 ? Internal("copy failed") : Status::Ok();
  };
  // Block 1 is cached already (held, not written); block 2 is written; 3 fails.
  EXPECT_EQ(m->RestoreHeldBlocks(2, prompt, kRootBlockHash, 1,
                                 std::span<const BlockHash>(all).subspan(1), fail_second),
            2);
  EXPECT_EQ(m->held_blocks(), 3);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  m->ReleaseHold(1);
  m->ReleaseHold(2);
  m->ReleaseHold(3);  // unknown: nothing
  EXPECT_EQ(m->held_blocks(), 0);
  EXPECT_EQ(m->Stats(0).in_use, 0);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

TEST(KvCacheManagerTest, AttachCachedContinuationNeedsABlockBoundary) {
  auto m = Make(FullSpec(), {8});
  const std::vector<int32_t> prompt = Iota(3 * kBs + 1, 1);
  ASSERT_TRUE(m->AddSequence(1).ok());
  Append(*m, 1, Head(prompt, kBs + 1));
  EXPECT_EQ(m->AttachCachedContinuation(1, prompt).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->AddSequence(2).ok());
  Append(*m, 2, Iota(kBs, 900));
  EXPECT_EQ(m->AttachCachedContinuation(2, prompt).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->AttachCachedContinuation(3, prompt).status().code(), StatusCode::kNotFound);
  // Nothing cached after the boundary: nothing attached, nothing changes.
  ASSERT_TRUE(m->AddSequence(4).ok());
  Append(*m, 4, Head(prompt, kBs));
  auto none = m->AttachCachedContinuation(4, prompt);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  EXPECT_EQ(m->NumTokens(4), kBs);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

TEST(KvCacheManagerTest, UnknownSequences) {
  auto m = Make(FullSpec(), {4});
  std::vector<KvBlockCopy> copies;
  EXPECT_EQ(m->EnsureCapacity(9, 1, &copies).code(), StatusCode::kNotFound);
  EXPECT_EQ(m->Fork(9, 10).code(), StatusCode::kNotFound);
  ASSERT_TRUE(m->AddSequence(1).ok());
  EXPECT_EQ(m->AddSequence(1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->Fork(1, 1).code(), StatusCode::kInvalidArgument);
  m->FreeSequence(9);  // ignored
  EXPECT_EQ(m->NumTokens(9), 0);
}

}  // namespace
}  // namespace agentkv::cache
