// Restore or recompute, end to end on the CPU backend with the store as the
// tier: a returning agent's prompt is split between a recomputed head and a
// tail loaded from the store (engine/restore_policy.h, KvTransfer), and the
// output is the output of a full prefill, whichever finishes first; a
// request cancelled mid-split leaves no block held.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "../engine/test_model.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine_turns.h"
#include "store/store_kv_tier.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using agentkv::testing::MapWeights;
using agentkv::testing::RandomWeights;
using agentkv::testing::SmallConfig;
using testing::Collect;
using testing::Done;
using testing::Greedy;
using testing::Prompt;
using testing::TempDir;

constexpr int kBlock = 4;
const char kModelFp[] = "00112233445566778899aabbccddeeff";

// The store's tier, with each load delayed (a slow disk).
class SlowTier : public cache::KvTier {
 public:
  SlowTier(std::shared_ptr<cache::KvTier> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  const char* source_name() const override { return inner_->source_name(); }
  Result<int32_t> CountStored(std::span<const int32_t> tokens, const cache::BlockHash& root,
                              int block_size, int32_t first_block, int32_t max_blocks) override {
    return inner_->CountStored(tokens, root, block_size, first_block, max_blocks);
  }
  Result<cache::KvTierLoad> Load(std::span<const int32_t> tokens, const cache::BlockHash& root,
                                 int block_size, int32_t first_block, int32_t max_blocks) override {
    std::this_thread::sleep_for(delay_);
    return inner_->Load(tokens, root, block_size, first_block, max_blocks);
  }
  Result<cache::KvTierLoadInto> LoadInto(std::span<const int32_t> tokens,
                                         const cache::BlockHash& root, int block_size,
                                         int32_t first_block, int32_t max_blocks,
                                         std::span<std::byte> dst, size_t block_bytes) override {
    std::this_thread::sleep_for(delay_);
    return inner_->LoadInto(tokens, root, block_size, first_block, max_blocks, dst, block_bytes);
  }
  void Save(const std::string& agent_key, uint32_t first_index,
            std::vector<cache::KvTierBlock> blocks) override {
    inner_->Save(agent_key, first_index, std::move(blocks));
  }
  Status Flush() override { return inner_->Flush(); }

 private:
  std::shared_ptr<cache::KvTier> inner_;
  std::chrono::milliseconds delay_;
};

struct EngineSetup {
  std::shared_ptr<cache::KvTier> tier;
  bool split = false;  // rates that split a prompt about in half
  int chunk_blocks = 2;
  int max_step_tokens = 64;
  double tier_latency_s = 0;
};

size_t BlockBytes() {
  return SmallConfig(model::Architecture::kQwen3)
      .CacheSpec(cache::KvDtype::kF32)
      .BytesPerBlock(0, kBlock);
}

std::unique_ptr<engine::Engine> MakeEngine(const EngineSetup& s) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const MapWeights w = RandomWeights(c, 21);
  auto backend = backend::cpu::CpuBackend::Create(
      c, w, backend::cpu::CpuBackendOptions{1, cache::KvDtype::kF32});
  EXPECT_TRUE(backend.ok());
  engine::EngineOptions o;
  o.block_size = kBlock;
  o.scheduler.max_batch = 8;
  o.scheduler.max_step_tokens = s.max_step_tokens;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), 256);
  o.kv_tier = s.tier;
  o.restore_chunk_bytes = s.chunk_blocks * BlockBytes();
  if (s.split) {
    // A block costs 1 ms to recompute and 1 ms to load.
    o.prefill_cost.seconds_per_token = 1e-3 / kBlock;
    o.tier_bytes_per_s = static_cast<double>(BlockBytes()) / 1e-3;
    o.tier_latency_s = s.tier_latency_s;
  }
  auto e = engine::Engine::Create(std::move(backend).value(), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

class SplitRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.sync = false;
    auto s = AgentStore::Open(dir_.path(), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    auto t = StoreKvTier::Create(store_.get(), kModelFp, "f32", kBlock, 4);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::shared_ptr<StoreKvTier>(std::move(t).value());
  }

  // Turn 1 of an agent (161 prompt tokens, 2 generated: 40 stored blocks)
  // on its own engine; returns turn 2's prompt (42 whole blocks and a bit).
  // `salt`: the turn's cache salt (a tenant's).
  std::vector<int32_t> StoreTurn(const std::string& agent, const std::string& salt = "") {
    std::vector<int32_t> p = Prompt(161);
    auto e = MakeEngine(EngineSetup{tier_});
    engine::EngineRequest r = Greedy(p, 2, agent);
    r.cache_salt = salt;
    Done d = Collect(e->Submit(std::move(r)).value());
    e->Stop();
    EXPECT_TRUE(store_->Flush().ok());
    p.insert(p.end(), d.tokens.begin(), d.tokens.end());
    for (int32_t t : Prompt(9, 5)) p.push_back(t);
    return p;
  }

  Done Reference(const std::vector<int32_t>& prompt) {
    auto e = MakeEngine(EngineSetup{nullptr});
    return Collect(e->Submit(Greedy(prompt, 12)).value());
  }

  // Turn 2 on a fresh engine (a restart); checks the split and the output.
  void ExpectSplitMatchesRecompute(const EngineSetup& s) {
    const std::vector<int32_t> p2 = StoreTurn("agent-s");
    auto e = MakeEngine(s);
    Done got = Collect(e->Submit(Greedy(p2, 12, "agent-s")).value());
    const engine::EngineStats st = e->Stats();
    EXPECT_EQ(st.split_restores, 1);
    // About half of the 40 stored blocks recomputed, the rest loaded.
    EXPECT_GE(st.split_recomputed_tokens, 10 * kBlock);
    EXPECT_LE(st.split_recomputed_tokens, 30 * kBlock);
    EXPECT_EQ(got.finished.cache_source, engine::CacheSource::kDisk);
    EXPECT_EQ(got.finished.restored_tokens + st.split_recomputed_tokens, 40 * kBlock);
    EXPECT_EQ(got.finished.cached_tokens, got.finished.restored_tokens);
    EXPECT_EQ(got.tokens, Reference(p2).tokens);
    e->Drain();
    EXPECT_EQ(e->Stats().pools[0].in_use, 0);
    e->Stop();
  }

  TempDir dir_;
  std::unique_ptr<AgentStore> store_;
  std::shared_ptr<StoreKvTier> tier_;
};

// A tenant's stored prefix (salted chain) splits and restores for that
// tenant as an unsalted one does; another tenant's request counts nothing
// stored and recomputes, with the same output.
TEST_F(SplitRestoreTest, SaltedPrefixSplitsForItsOwnSaltOnly) {
  const std::vector<int32_t> p2 = StoreTurn("acme/s", "4:acme");
  EXPECT_EQ(*tier_->CountStored(p2, cache::ChainRoot("4:acme"), kBlock, 0, 1000), 40);
  EXPECT_EQ(*tier_->CountStored(p2, cache::ChainRoot("4:zeta"), kBlock, 0, 1000), 0);
  EXPECT_EQ(*tier_->CountStored(p2, cache::kRootBlockHash, kBlock, 0, 1000), 0);
  const Done want = Reference(p2);
  {
    auto e = MakeEngine(EngineSetup{tier_, /*split=*/true});
    engine::EngineRequest r = Greedy(p2, 12, "zeta/s");
    r.cache_salt = "4:zeta";
    Done other = Collect(e->Submit(std::move(r)).value());
    EXPECT_EQ(other.finished.cached_tokens, 0);
    EXPECT_EQ(e->Stats().split_restores, 0);
    EXPECT_EQ(other.tokens, want.tokens);
    e->Stop();
  }
  auto e = MakeEngine(EngineSetup{tier_, /*split=*/true});
  engine::EngineRequest r = Greedy(p2, 12, "acme/s");
  r.cache_salt = "4:acme";
  Done own = Collect(e->Submit(std::move(r)).value());
  const engine::EngineStats st = e->Stats();
  EXPECT_EQ(st.split_restores, 1);
  EXPECT_GT(own.finished.restored_tokens, 0);
  EXPECT_EQ(own.finished.restored_tokens + st.split_recomputed_tokens, 40 * kBlock);
  EXPECT_EQ(own.tokens, want.tokens);
  e->Drain();
  EXPECT_EQ(e->Stats().pools[0].in_use, 0);
  e->Stop();
}

TEST_F(SplitRestoreTest, CountStoredStopsAtTheFirstMissingBlock) {
  const std::vector<int32_t> p2 = StoreTurn("agent-c");
  auto n = tier_->CountStored(p2, cache::kRootBlockHash, kBlock, 0, 1000);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 40);
  EXPECT_EQ(*tier_->CountStored(p2, cache::kRootBlockHash, kBlock, 10, 1000), 30);
  EXPECT_EQ(*tier_->CountStored(p2, cache::kRootBlockHash, kBlock, 10, 5), 5);
  EXPECT_EQ(*tier_->CountStored(Prompt(100, 3), cache::kRootBlockHash, kBlock, 0, 1000), 0);
}

TEST_F(SplitRestoreTest, SplitGivesTheOutputOfARecompute) {
  ExpectSplitMatchesRecompute(EngineSetup{tier_, true});
}

TEST_F(SplitRestoreTest, HeadDoneFirstWaitsAtItsLimitForTheTail) {
  // Each chunk of two blocks takes 40 ms to load; the head takes two steps.
  ExpectSplitMatchesRecompute(
      EngineSetup{std::make_shared<SlowTier>(tier_, std::chrono::milliseconds(40)), true});
}

TEST_F(SplitRestoreTest, TailDoneFirstWaitsForTheHead) {
  // The whole tail in one chunk; the head four tokens a step.
  ExpectSplitMatchesRecompute(EngineSetup{tier_, true, 64, 4});
}

TEST_F(SplitRestoreTest, ATierSlowToStartIsNotAskedAtAll) {
  // A second before the first block: recomputing the 40 blocks (40 ms) wins.
  const std::vector<int32_t> p2 = StoreTurn("agent-r");
  auto e = MakeEngine(EngineSetup{tier_, true, 2, 64, 1.0});
  Done got = Collect(e->Submit(Greedy(p2, 12, "agent-r")).value());
  EXPECT_EQ(e->Stats().recomputed_restores, 1);
  EXPECT_EQ(e->Stats().split_restores, 0);
  EXPECT_EQ(got.finished.restored_tokens, 0);
  EXPECT_EQ(got.finished.cache_source, engine::CacheSource::kNone);
  EXPECT_EQ(got.tokens, Reference(p2).tokens);
}

TEST_F(SplitRestoreTest, WithoutRatesEverythingIsLoaded) {
  const std::vector<int32_t> p2 = StoreTurn("agent-l");
  auto e = MakeEngine(EngineSetup{tier_});
  Done got = Collect(e->Submit(Greedy(p2, 12, "agent-l")).value());
  EXPECT_EQ(e->Stats().split_restores, 0);
  EXPECT_EQ(got.finished.restored_tokens, 40 * kBlock);
  EXPECT_EQ(got.tokens, Reference(p2).tokens);
}

TEST_F(SplitRestoreTest, CancelledMidSplitHoldsNothing) {
  const std::vector<int32_t> p2 = StoreTurn("agent-x");
  auto e = MakeEngine(
      EngineSetup{std::make_shared<SlowTier>(tier_, std::chrono::milliseconds(100)), true});
  engine::RequestHandle h = e->Submit(Greedy(p2, 12, "agent-x")).value();
  // Wait until the split started (its head is prefilling or done).
  for (int i = 0; i < 400 && e->Stats().split_restores == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(e->Stats().split_restores, 1);
  e->Cancel(h.id);
  Done d = Collect(h);
  EXPECT_TRUE(d.finished.cancelled);
  // The tail's load stops early; the blocks held for it go back.
  for (int i = 0; i < 400 && e->Stats().pools[0].in_use > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e->Stats().pools[0].in_use, 0);
  EXPECT_EQ(e->Stats().loading, 0);
  // The same prompt afterwards: right output, whatever was cached meanwhile.
  Done again = Collect(e->Submit(Greedy(p2, 12, "agent-x")).value());
  EXPECT_EQ(again.tokens, Reference(p2).tokens);
  e->Stop();
}

}  // namespace
}  // namespace agentkv::store
