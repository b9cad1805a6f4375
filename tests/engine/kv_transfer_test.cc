// KvTransfer without the engine thread, on the CPU backend with a small
// random model and an in-memory KV tier: pool evictions land in the host
// tier with their bytes and come back from it; a finished turn goes to the
// store and the host tier; the resume order is pool, host, store; store
// restores run through the loader; parked loads cancel; agents' residency.
// Restore copies are asynchronous: with a backend that reports them done
// late (testing::DeferredWriteBackend), their host sources (host-tier
// slots, restore slots) stay untouched until then.
#include "engine/kv_transfer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "deferred_write_backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "test_model.h"

namespace agentkv::engine {
namespace {

constexpr int kBs = 4;

// A KV tier in memory: the whole contract (chained lookups that check the
// tokens, write-behind saves that copy what they keep, flush), no disk.
class MemoryTier : public cache::KvTier {
 public:
  const char* source_name() const override { return "memory"; }
  Result<cache::KvTierLoad> Load(std::span<const int32_t> tokens, const cache::BlockHash& root,
                                 int block_size, int32_t first_block, int32_t max_blocks) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++loads_;
    cache::KvTierLoad out;
    const std::vector<cache::BlockHash> hashes = cache::HashFullBlocks(tokens, block_size, root);
    for (int64_t i = first_block;
         i < static_cast<int64_t>(hashes.size()) && i < int64_t{first_block} + max_blocks; ++i) {
      auto it = blocks_.find(Key(hashes[i]));
      const auto bt = tokens.subspan(static_cast<size_t>(i) * block_size, block_size);
      if (it == blocks_.end() ||
          !std::equal(bt.begin(), bt.end(), it->second.tokens.begin(), it->second.tokens.end()))
        break;
      out.blocks.push_back(
          cache::KvTierBlock{hashes[i], it->second.tokens, SharedBytes(it->second.data)});
    }
    return out;
  }
  void Save(const std::string& agent, uint32_t, std::vector<cache::KvTierBlock> blocks) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++saves_[agent];
    for (cache::KvTierBlock& b : blocks) {
      if (b.data.size() == 0) continue;
      blocks_[Key(b.hash)] = Stored{b.tokens, std::string(b.data.data(), b.data.size())};
    }
  }
  Status Flush() override { return Status::Ok(); }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.size();
  }
  int loads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return loads_;
  }
  int saves(const std::string& agent) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = saves_.find(agent);
    return it == saves_.end() ? 0 : it->second;
  }

 private:
  struct Stored {
    std::vector<int32_t> tokens;
    std::string data;
  };
  static std::pair<uint64_t, uint64_t> Key(const cache::BlockHash& h) { return {h.lo, h.hi}; }
  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, Stored> blocks_;
  int loads_ = 0;
  std::map<std::string, int> saves_;  // Save calls per agent
};

class KvTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const model::ModelConfig c = testing::SmallConfig(model::Architecture::kLlama);
    auto b = backend::cpu::CpuBackend::Create(c, testing::RandomWeights(c, 5),
                                              backend::cpu::CpuBackendOptions{1});
    ASSERT_TRUE(b.ok());
    backend_ = std::move(b).value();
    backend::KvLayout layout;
    layout.block_size = kBs;
    layout.blocks_per_group[0] = 16;
    ASSERT_TRUE(backend_->AllocateKv(layout).ok());
    block_bytes_ = backend_->cache_spec().BytesPerBlock(0, kBs);
    NewManager();
  }
  // Wraps the backend so that restore copies are reported done only after
  // `polls` non-waiting polls. Call before NewTransfer.
  testing::DeferredWriteBackend* UseDeferredWrites(int polls) {
    auto d = std::make_unique<testing::DeferredWriteBackend>(std::move(backend_), polls);
    testing::DeferredWriteBackend* raw = d.get();
    backend_ = std::move(d);
    return raw;
  }
  void NewManager() {
    transfer_.reset();
    cache::KvCacheConfig kc;
    kc.block_size = kBs;
    kc.blocks_per_group = {16};
    auto m = cache::KvCacheManager::Create(backend_->cache_spec(), kc);
    ASSERT_TRUE(m.ok());
    kv_ = std::move(m).value();
  }
  void NewTransfer(uint64_t host_bytes, std::shared_ptr<cache::KvTier> tier) {
    transfer_.reset();
    KvTransferOptions o;
    o.block_size = kBs;
    o.kv_tier = std::move(tier);
    o.host_kv_bytes = host_bytes;
    o.restore_chunk_bytes = 2 * block_bytes_;  // several chunks per load
    o.save_staging_bytes = 4 * block_bytes_;
    auto t = KvTransfer::Create(backend_.get(), kv_.get(), o, [this] { ++wakes_; });
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    transfer_ = std::move(t).value();
  }
  // Puts a sequence with `tokens` into the pool as if computed: its blocks
  // hold a pattern derived from `seed` and the block index.
  void Compute(int64_t id, const std::vector<int32_t>& tokens, uint8_t seed) {
    ASSERT_TRUE(kv_->AddSequence(id).ok());
    std::vector<cache::KvBlockCopy> copies;
    ASSERT_TRUE(kv_->EnsureCapacity(id, static_cast<int64_t>(tokens.size()), &copies).ok());
    const auto& blocks = kv_->Table(id, 0).blocks();
    transfer_->FlushEvictions();  // as the engine does before writing blocks
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::vector<std::byte> data(block_bytes_, std::byte(seed + i));
      ASSERT_TRUE(backend_->WriteBlocks(0, std::span(&blocks[i], 1), data).ok());
    }
    ASSERT_TRUE(kv_->CommitTokens(id, tokens).ok());
  }
  // The pool's bytes of the cached blocks of `tokens` (whole blocks).
  std::vector<uint8_t> CachedFirstBytes(const std::vector<int32_t>& tokens, int n) {
    std::vector<uint8_t> out;
    const std::vector<cache::BlockHash> h = cache::HashFullBlocks(tokens, kBs);
    std::vector<std::byte> buf(block_bytes_);
    for (int i = 0; i < n; ++i) {
      std::optional<int32_t> b = kv_->CachedBlock(h[i]);
      if (!b) break;
      EXPECT_TRUE(backend_->ReadBlock(0, *b, buf).ok());
      // Every byte of the block holds the pattern.
      EXPECT_EQ(std::count(buf.begin(), buf.end(), buf[0]), static_cast<long>(buf.size()));
      out.push_back(static_cast<uint8_t>(buf[0]));
    }
    return out;
  }
  std::unique_ptr<Sequence> Request(int64_t id, std::vector<int32_t> prompt,
                                    std::string agent = "") {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->request.agent_key = std::move(agent);
    s->request.prompt = prompt;
    s->tokens = std::move(prompt);
    s->prompt_len = s->tokens.size();
    return s;
  }
  std::vector<int32_t> Tokens(int n, int32_t from) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back((from + 5 * i) % 97);
    return v;
  }
  // Waits for the loader, then applies what it loaded.
  std::vector<std::unique_ptr<Sequence>> WaitRestored() {
    std::vector<std::unique_ptr<Sequence>> out;
    for (int i = 0; i < 5000 && out.empty(); ++i) {
      for (auto& s : transfer_->TakeRestored()) out.push_back(std::move(s));
      transfer_->CompleteSaves(/*wait=*/false);  // as the engine loop does
      if (out.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return out;
  }

  std::unique_ptr<backend::Backend> backend_;
  size_t block_bytes_ = 0;
  std::unique_ptr<cache::KvCacheManager> kv_;
  std::unique_ptr<KvTransfer> transfer_;
  std::atomic<int> wakes_{0};
};

TEST_F(KvTransferTest, WithoutTiersEveryRequestIsScheduledAtOnce) {
  NewTransfer(0, nullptr);
  auto s = transfer_->Admit(Request(1, Tokens(13, 1)));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->host_restored_tokens, 0);
  EXPECT_EQ(transfer_->parked(), 0u);
  EXPECT_EQ(transfer_->host_tier(), nullptr);
  EXPECT_EQ(transfer_->Stats().host.capacity_bytes, 0);
}

TEST_F(KvTransferTest, EvictedBlocksComeBackFromHostWithTheirBytes) {
  NewTransfer(64 * block_bytes_, nullptr);
  const std::vector<int32_t> t = Tokens(12, 3);  // 3 full blocks
  Compute(1, t, 40);
  kv_->FreeSequence(1);
  EXPECT_EQ(kv_->CachedPrefixTokens(Tokens(13, 3), cache::kRootBlockHash), 12);
  // The pool lets them go; their bytes are read into the host tier.
  EXPECT_EQ(kv_->EvictIdle(0, 100), 3);
  transfer_->FlushEvictions();
  transfer_->CompleteSaves(false);
  EXPECT_EQ(transfer_->Stats().host.blocks, 3);
  EXPECT_EQ(kv_->CachedPrefixTokens(Tokens(13, 3), cache::kRootBlockHash), 0);
  // A request for the same prefix gets them back before it is scheduled.
  auto s = transfer_->Admit(Request(2, Tokens(13, 3)));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->host_restored_tokens, 12);
  // A synchronous backend's copies are done at once: nothing stays held.
  EXPECT_FALSE(transfer_->WritesPending());
  EXPECT_EQ(kv_->CachedPrefixTokens(s->tokens, cache::kRootBlockHash), 12);
  EXPECT_EQ(CachedFirstBytes(s->tokens, 3), (std::vector<uint8_t>{40, 41, 42}));
  EXPECT_EQ(transfer_->Stats().host_restored_tokens, 12);
  EXPECT_TRUE(kv_->CheckInvariants().ok());
}

TEST_F(KvTransferTest, ADifferentPrefixFindsNothingInHost) {
  NewTransfer(64 * block_bytes_, nullptr);
  Compute(1, Tokens(12, 3), 40);
  kv_->FreeSequence(1);
  kv_->EvictIdle(0, 100);
  transfer_->FlushEvictions();
  std::vector<int32_t> other = Tokens(13, 3);
  other[0] = 96;  // the first block differs, so every later hash does too
  auto s = transfer_->Admit(Request(2, other));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->host_restored_tokens, 0);
  EXPECT_EQ(kv_->CachedPrefixTokens(other, cache::kRootBlockHash), 0);
}

TEST_F(KvTransferTest, FinishedTurnGoesToStoreAndHostAndResumesFromHostFirst) {
  auto tier = std::make_shared<MemoryTier>();
  NewTransfer(64 * block_bytes_, tier);
  const std::vector<int32_t> t = Tokens(16, 7);  // 4 full blocks
  auto s = Request(1, t, "agent");
  Compute(1, t, 10);
  transfer_->RetireAgent(s.get());
  kv_->FreeSequence(1);
  EXPECT_EQ(transfer_->AgentResidentTokens("agent"), 16);
  transfer_->CompleteSaves(/*wait=*/true);
  EXPECT_FALSE(transfer_->SavesPending());
  EXPECT_EQ(tier->size(), 4u);
  EXPECT_EQ(transfer_->Stats().saved_blocks, 4);
  EXPECT_EQ(transfer_->Stats().host.blocks, 4);
  // The pool forgets the agent entirely.
  transfer_->DropAgent("agent");
  EXPECT_EQ(transfer_->AgentResidentTokens("agent"), 0);
  kv_->EvictIdle(0, 100);
  transfer_->FlushEvictions();
  std::vector<int32_t> next = t;
  next.push_back(1);
  auto r = transfer_->Admit(Request(2, next, "agent"));
  ASSERT_NE(r, nullptr);  // the host tier had it all: not parked for the store
  EXPECT_EQ(r->host_restored_tokens, 16);
  EXPECT_EQ(r->restored_tokens, 0);
  EXPECT_EQ(tier->loads(), 0);
  EXPECT_EQ(CachedFirstBytes(next, 4), (std::vector<uint8_t>{10, 11, 12, 13}));
}

TEST_F(KvTransferTest, DroppedAgentsQueuedSavesNeverReachTheTiers) {
  auto tier = std::make_shared<MemoryTier>();
  NewTransfer(64 * block_bytes_, tier);
  // Staging holds 4 blocks: 4 of the 6 blocks of "gone" are being read, 2
  // wait in the backlog, and "kept"'s turn waits behind them.
  const std::vector<int32_t> g = Tokens(24, 7);
  auto sg = Request(1, g, "gone");
  Compute(1, g, 10);
  transfer_->RetireAgent(sg.get());
  kv_->FreeSequence(1);
  const std::vector<int32_t> k = Tokens(8, 50);
  auto sk = Request(2, k, "kept");
  Compute(2, k, 30);
  transfer_->RetireAgent(sk.get());
  kv_->FreeSequence(2);
  ASSERT_TRUE(transfer_->SavesPending());
  // Deleted while its saves are in flight.
  transfer_->DropAgent("gone");
  transfer_->DrainSaves();
  EXPECT_FALSE(transfer_->SavesPending());
  EXPECT_EQ(tier->saves("gone"), 0);
  EXPECT_EQ(tier->saves("kept"), 1);
  EXPECT_EQ(tier->size(), 2u);
  // The host tier read both turns' blocks from the device when they were
  // retired: like the pool's prefix cache, it is a volatile cache of
  // blocks by content (evicted by LRU), not the agent's durable record.
  EXPECT_EQ(transfer_->Stats().host.blocks, 8);
  EXPECT_EQ(transfer_->AgentResidentTokens("gone"), 0);
  EXPECT_EQ(transfer_->AgentResidentTokens("kept"), 8);
}

TEST_F(KvTransferTest, StoreRestoresWhatThePoolAndHostLack) {
  auto tier = std::make_shared<MemoryTier>();
  NewTransfer(0, tier);
  const std::vector<int32_t> t = Tokens(24, 9);  // 6 full blocks
  auto s = Request(1, t, "agent");
  Compute(1, t, 20);
  transfer_->RetireAgent(s.get());
  kv_->FreeSequence(1);
  transfer_->DrainSaves();
  ASSERT_EQ(tier->size(), 6u);
  transfer_->ReleaseAgents();
  // A new pool, as after a restart: the first two blocks computed again
  // (resident), the rest come from the store, in chunks of two.
  NewManager();
  NewTransfer(0, tier);
  Compute(5, std::vector<int32_t>(t.begin(), t.begin() + 8), 20);
  kv_->FreeSequence(5);
  std::vector<int32_t> next = t;
  next.push_back(2);
  ASSERT_EQ(transfer_->Admit(Request(2, next, "agent")), nullptr);  // parked
  EXPECT_EQ(transfer_->parked(), 1u);
  auto ready = WaitRestored();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_GT(wakes_.load(), 0);
  EXPECT_EQ(ready[0]->resident_before_restore, 8);
  EXPECT_EQ(ready[0]->restored_tokens, 16);
  EXPECT_EQ(transfer_->parked(), 0u);
  EXPECT_EQ(CachedFirstBytes(next, 6), (std::vector<uint8_t>{20, 21, 22, 23, 24, 25}));
  EXPECT_EQ(transfer_->Stats().restored_tokens, 16);
}

TEST_F(KvTransferTest, CancelledParkedRequestComesBackAndItsLoadEnds) {
  auto tier = std::make_shared<MemoryTier>();
  NewTransfer(0, tier);
  const std::vector<int32_t> t = Tokens(24, 11);
  auto s = Request(1, t, "agent");
  Compute(1, t, 30);
  transfer_->RetireAgent(s.get());
  kv_->FreeSequence(1);
  transfer_->DrainSaves();
  transfer_->ReleaseAgents();
  NewManager();
  NewTransfer(0, tier);
  std::vector<int32_t> next = t;
  next.push_back(3);
  ASSERT_EQ(transfer_->Admit(Request(2, next)), nullptr);
  std::unique_ptr<Sequence> back = transfer_->CancelParked(2);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->id, 2);
  EXPECT_EQ(transfer_->CancelParked(2), nullptr);
  EXPECT_EQ(transfer_->parked(), 0u);
  // Chunks of the cancelled load are applied to nothing and free their slots.
  for (int i = 0; i < 200; ++i) {
    EXPECT_TRUE(transfer_->TakeRestored().empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(transfer_->HasLoaded());
  EXPECT_TRUE(kv_->CheckInvariants().ok());
}

TEST_F(KvTransferTest, PreemptedSequenceGetsItsEvictedBlocksBackFromHost) {
  NewTransfer(64 * block_bytes_, nullptr);
  std::vector<int32_t> t = Tokens(14, 13);  // 3 full blocks and a partial one
  auto s = Request(1, t);
  Compute(1, t, 50);
  kv_->FreeSequence(1);  // preempted
  kv_->EvictIdle(0, 100);
  transfer_->FlushEvictions();
  // Placeholders of picks in flight are never restored against.
  s->in_flight = 3;  // only 11 real tokens: 2 whole blocks before the last
  transfer_->RestoreBeforeAdmit(s.get());
  EXPECT_EQ(s->host_restored_tokens, 8);
  s->in_flight = 0;
  transfer_->RestoreBeforeAdmit(s.get());
  EXPECT_EQ(s->host_restored_tokens, 12);
  EXPECT_EQ(kv_->CachedPrefixTokens(t, cache::kRootBlockHash), 12);
  EXPECT_EQ(CachedFirstBytes(t, 3), (std::vector<uint8_t>{50, 51, 52}));
}

// Puts `t` (seed `seed`) in the pool, then lets the pool evict it into the
// host tier.
#define EVICT_TO_HOST(id, t, seed)   \
  do {                               \
    Compute(id, t, seed);            \
    kv_->FreeSequence(id);           \
    kv_->EvictIdle(0, 100);          \
    transfer_->FlushEvictions();     \
    transfer_->CompleteSaves(false); \
  } while (0)

TEST_F(KvTransferTest, HostSlotsStayLeasedUntilTheRestoreCopiesAreDone) {
  testing::DeferredWriteBackend* dev = UseDeferredWrites(/*polls=*/50);
  NewTransfer(4 * block_bytes_, nullptr);        // four host slots
  const std::vector<int32_t> t = Tokens(12, 3);  // 3 full blocks
  EVICT_TO_HOST(1, t, 40);
  ASSERT_EQ(transfer_->Stats().host.blocks, 3);
  auto s = transfer_->Admit(Request(2, Tokens(13, 3)));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->host_restored_tokens, 12);
  // Issued, not waited for.
  EXPECT_TRUE(transfer_->WritesPending());
  EXPECT_GT(dev->writes_pending(), 0u);
  // Reads issued later see the restored bytes without any wait.
  EXPECT_EQ(CachedFirstBytes(s->tokens, 3), (std::vector<uint8_t>{40, 41, 42}));
  // Other blocks pass through the host tier meanwhile: three of its four
  // slots are the copies' sources, so only one takes a new block; the
  // leased ones are neither evicted nor overwritten.
  EVICT_TO_HOST(3, Tokens(16, 50), 60);
  const std::vector<cache::BlockHash> h = cache::HashFullBlocks(t, kBs);
  for (const cache::BlockHash& x : h) EXPECT_TRUE(transfer_->host_tier()->Contains(x));
  EXPECT_EQ(transfer_->Stats().host.blocks, 4);
  EXPECT_EQ(transfer_->Stats().host.evictions, 0);
  EXPECT_TRUE(transfer_->WritesPending());
  // Polled until done (the engine loop's CompleteSaves), the leases end...
  for (int i = 0; i < 100 && transfer_->WritesPending(); ++i) transfer_->CompleteSaves(false);
  EXPECT_FALSE(transfer_->WritesPending());
  EXPECT_EQ(dev->writes_pending(), 0u);
  EXPECT_EQ(dev->source_changes(), 0);
  EXPECT_GT(transfer_->Stats().host_write_done_seconds, 0);
  // ... and the blocks are evictable again.
  EVICT_TO_HOST(4, Tokens(16, 70), 80);
  for (const cache::BlockHash& x : h) EXPECT_FALSE(transfer_->host_tier()->Contains(x));
  EXPECT_GE(transfer_->Stats().host.evictions, 3);
  EXPECT_TRUE(kv_->CheckInvariants().ok());
}

TEST_F(KvTransferTest, PendingRestoreCopiesAreWaitedForAtDrainAndRelease) {
  testing::DeferredWriteBackend* dev = UseDeferredWrites(/*polls=*/1000);
  NewTransfer(64 * block_bytes_, nullptr);
  const std::vector<int32_t> t = Tokens(12, 3);
  EVICT_TO_HOST(1, t, 40);
  auto s = transfer_->Admit(Request(2, Tokens(13, 3)));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(transfer_->WritesPending());
  transfer_->DrainSaves();
  EXPECT_FALSE(transfer_->WritesPending());
  EXPECT_EQ(dev->writes_pending(), 0u);
  // Restored again after the pool lost them once more, then the buffers go
  // (a model swap) with the copies in flight: they are waited for first.
  kv_->EvictIdle(0, 100);
  transfer_->FlushEvictions();
  auto r = transfer_->Admit(Request(3, Tokens(13, 3)));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->host_restored_tokens, 12);
  ASSERT_TRUE(transfer_->WritesPending());
  transfer_->ReleaseBuffers();
  EXPECT_FALSE(transfer_->WritesPending());
  EXPECT_EQ(dev->writes_pending(), 0u);
  EXPECT_EQ(dev->source_changes(), 0);
  EXPECT_EQ(CachedFirstBytes(r->tokens, 3), (std::vector<uint8_t>{40, 41, 42}));
}

TEST_F(KvTransferTest, ARestoreCopyThatFailsToStartRestoresNothing) {
  testing::DeferredWriteBackend* dev = UseDeferredWrites(/*polls=*/3);
  NewTransfer(64 * block_bytes_, nullptr);
  const std::vector<int32_t> t = Tokens(12, 3);
  EVICT_TO_HOST(1, t, 40);
  dev->FailNextStart();
  auto s = transfer_->Admit(Request(2, Tokens(13, 3)));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->host_restored_tokens, 0);
  EXPECT_EQ(transfer_->Stats().restore_problems, 1);
  EXPECT_FALSE(transfer_->WritesPending());  // nothing issued, nothing held
  EXPECT_EQ(kv_->CachedPrefixTokens(s->tokens, cache::kRootBlockHash), 0);
  // The host blocks were not lost: the next request gets them.
  auto r = transfer_->Admit(Request(3, Tokens(13, 3)));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->host_restored_tokens, 12);
  EXPECT_EQ(CachedFirstBytes(r->tokens, 3), (std::vector<uint8_t>{40, 41, 42}));
  EXPECT_TRUE(kv_->CheckInvariants().ok());
}

TEST_F(KvTransferTest, ARestoreCopyThatFailsLateDropsItsBlocks) {
  testing::DeferredWriteBackend* dev = UseDeferredWrites(/*polls=*/3);
  NewTransfer(64 * block_bytes_, nullptr);
  const std::vector<int32_t> t = Tokens(12, 3);
  EVICT_TO_HOST(1, t, 40);
  dev->FailNextDone();
  auto s = transfer_->Admit(Request(2, Tokens(13, 3)));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(kv_->CachedPrefixTokens(s->tokens, cache::kRootBlockHash), 12);
  for (int i = 0; i < 10 && transfer_->WritesPending(); ++i) transfer_->CompleteSaves(false);
  EXPECT_FALSE(transfer_->WritesPending());
  // The blocks may hold anything: the pool serves them no longer.
  EXPECT_EQ(transfer_->Stats().restore_problems, 1);
  EXPECT_EQ(kv_->CachedPrefixTokens(s->tokens, cache::kRootBlockHash), 0);
  // The leases ended: the host tier serves the blocks again.
  auto r = transfer_->Admit(Request(3, Tokens(13, 3)));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->host_restored_tokens, 12);
  transfer_->DrainSaves();
  EXPECT_EQ(CachedFirstBytes(r->tokens, 3), (std::vector<uint8_t>{40, 41, 42}));
  EXPECT_TRUE(kv_->CheckInvariants().ok());
}

TEST_F(KvTransferTest, StoreRestoreSlotsGoBackOnlyOnceTheirCopiesAreDone) {
  testing::DeferredWriteBackend* dev = UseDeferredWrites(/*polls=*/3);
  auto tier = std::make_shared<MemoryTier>();
  NewTransfer(0, tier);
  const std::vector<int32_t> t = Tokens(40, 9);  // 10 full blocks
  auto s = Request(1, t, "agent");
  Compute(1, t, 20);
  transfer_->RetireAgent(s.get());
  kv_->FreeSequence(1);
  transfer_->DrainSaves();
  ASSERT_EQ(tier->size(), 10u);
  transfer_->ReleaseAgents();
  NewManager();
  NewTransfer(0, tier);
  std::vector<int32_t> next = t;
  next.push_back(2);
  // Five chunks of two blocks through three restore slots: each slot is
  // refilled only once the copy out of it is done.
  ASSERT_EQ(transfer_->Admit(Request(2, next, "agent")), nullptr);
  const int64_t started = dev->writes_started();
  auto ready = WaitRestored();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0]->restored_tokens, 40);
  EXPECT_EQ(dev->writes_started() - started, 5);
  transfer_->DrainSaves();
  EXPECT_FALSE(transfer_->WritesPending());
  EXPECT_EQ(dev->source_changes(), 0);
  EXPECT_EQ(CachedFirstBytes(next, 10),
            (std::vector<uint8_t>{20, 21, 22, 23, 24, 25, 26, 27, 28, 29}));
  EXPECT_GT(transfer_->Stats().restore_write_done_seconds, 0);
}

#undef EVICT_TO_HOST

}  // namespace
}  // namespace agentkv::engine
