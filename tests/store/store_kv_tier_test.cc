// The store as the engine's KV tier, end to end on the CPU backend: an agent's
// turn is written behind, a fresh engine (a restart) restores the stored
// prefix and prefills only the suffix, with the same output as a full
// prefill; records of another model or KV format are never used; a corrupt
// record ends the restored prefix and the output is still right.
#include "store/store_kv_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "../engine/deferred_write_backend.h"
#include "../engine/test_model.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/finish_reason.h"
#include "engine_turns.h"
#include "store/records.h"
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
const char kModelFp[] = "0123456789abcdef0123456789abcdef";

// `chunk_blocks` > 0: restores are staged that many blocks at a time (the
// default stages 64 MiB, so a test model's restore is one chunk).
// `deferred_write_polls` > 0: restore copies are reported done only after
// that many polls (agentkv::testing::DeferredWriteBackend).
std::unique_ptr<engine::Engine> MakeEngine(std::shared_ptr<cache::KvTier> tier, int blocks = 256,
                                           int chunk_blocks = 0, int save_staging_blocks = 0,
                                           cache::KvDtype kv = cache::KvDtype::kF32,
                                           int deferred_write_polls = 0) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  const MapWeights w = RandomWeights(c, 21);
  auto cpu = backend::cpu::CpuBackend::Create(c, w, backend::cpu::CpuBackendOptions{1, kv});
  EXPECT_TRUE(cpu.ok());
  std::unique_ptr<backend::Backend> backend = std::move(cpu).value();
  if (deferred_write_polls > 0)
    backend = std::make_unique<agentkv::testing::DeferredWriteBackend>(std::move(backend),
                                                                       deferred_write_polls);
  engine::EngineOptions o;
  o.block_size = kBlock;
  o.scheduler.max_batch = 8;
  o.scheduler.max_step_tokens = 64;
  o.blocks_per_group.assign(c.CacheSpec(cache::KvDtype::kF32).groups.size(), blocks);
  o.kv_tier = std::move(tier);
  if (chunk_blocks > 0) {
    o.restore_chunk_bytes =
        chunk_blocks * c.CacheSpec(cache::KvDtype::kF32).BytesPerBlock(0, kBlock);
  }
  if (save_staging_blocks > 0) {
    o.save_staging_bytes =
        save_staging_blocks * c.CacheSpec(cache::KvDtype::kF32).BytesPerBlock(0, kBlock);
  }
  auto e = engine::Engine::Create(std::move(backend), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

std::shared_ptr<StoreKvTier> Tier(AgentStore* store, const std::string& kv_format = "f32",
                                  const std::string& model_fp = kModelFp) {
  auto t = StoreKvTier::Create(store, model_fp, kv_format, kBlock, 4);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::shared_ptr<StoreKvTier>(std::move(t).value());
}

class StoreKvTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.sync = false;
    auto s = AgentStore::Open(dir_.path(), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  // One agent turn on a fresh engine; flushes the store afterwards.
  Done Turn(std::shared_ptr<cache::KvTier> tier, std::vector<int32_t> prompt, int max_tokens,
            const std::string& agent, cache::KvDtype kv = cache::KvDtype::kF32) {
    auto e = MakeEngine(tier, 256, 0, 0, kv);
    Done d = Collect(e->Submit(Greedy(std::move(prompt), max_tokens, agent)).value());
    e->Stop();
    EXPECT_TRUE(store_->Flush().ok());
    return d;
  }

  TempDir dir_;
  std::unique_ptr<AgentStore> store_;
};

TEST_F(StoreKvTierTest, RestartRestoresStoredPrefixWithSameOutput) {
  auto tier = Tier(store_.get());
  // Turn 1: 41 prompt tokens + 8 generated = 12 full blocks after the turn.
  const std::vector<int32_t> p1 = Prompt(41);
  Done t1 = Turn(tier, p1, 8, "agent-a");
  EXPECT_EQ(t1.finished.cache_source, engine::CacheSource::kNone);
  auto chain = store_->GetKvChain("agent-a", tier->fingerprint());
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->size(), (41u + 8u - 1) / kBlock);  // the last token's KV is not computed

  // Turn 2 after a "restart": the history plus a new message.
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
  for (int32_t t : Prompt(9, 5)) p2.push_back(t);
  Done restored = Turn(tier, p2, 12, "agent-a");
  Done reference = Turn(nullptr, p2, 12, "");
  EXPECT_EQ(restored.tokens, reference.tokens);
  EXPECT_EQ(restored.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_EQ(restored.finished.restored_tokens, static_cast<int64_t>(chain->size()) * kBlock);
  EXPECT_EQ(restored.finished.cached_tokens, restored.finished.restored_tokens);
  EXPECT_EQ(reference.finished.cached_tokens, 0);

  // The chain now covers turn 2 too, written incrementally.
  auto chain2 = store_->GetKvChain("agent-a", tier->fingerprint());
  ASSERT_TRUE(chain2.ok());
  EXPECT_EQ(chain2->size(), (p2.size() + 12 - 1) / kBlock);
}

TEST_F(StoreKvTierTest, ResidentPrefixIsNotReloadedAndStatsCount) {
  auto tier = Tier(store_.get());
  auto e = MakeEngine(tier);
  const std::vector<int32_t> p1 = Prompt(30);
  Done t1 = Collect(e->Submit(Greedy(p1, 4, "agent-r")).value());
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
  p2.push_back(11);
  Done t2 = Collect(e->Submit(Greedy(p2, 4, "agent-r")).value());
  EXPECT_EQ(t2.finished.cache_source, engine::CacheSource::kResident);
  EXPECT_EQ(t2.finished.restored_tokens, 0);
  EXPECT_GT(e->AgentResidentTokens("agent-r"), 30);
  e->Drain();
  const engine::EngineStats st = e->Stats();
  EXPECT_EQ(st.resumed_none, 1);
  EXPECT_EQ(st.resumed_resident, 1);
  EXPECT_EQ(st.resumed_disk, 0);
  EXPECT_GT(st.saved_blocks, 0);
}

TEST_F(StoreKvTierTest, OtherModelOrFormatNeverRestores) {
  const std::vector<int32_t> p = Prompt(40);
  Turn(Tier(store_.get()), p, 4, "agent-b");
  std::vector<int32_t> p2 = p;
  p2.push_back(1);
  Done other_model = Turn(Tier(store_.get(), "f32", std::string(32, 'e')), p2, 4, "agent-b");
  EXPECT_EQ(other_model.finished.cached_tokens, 0);
  Done other_format = Turn(Tier(store_.get(), "bf16"), p2, 4, "agent-b");
  EXPECT_EQ(other_format.finished.cached_tokens, 0);
  Done same = Turn(Tier(store_.get()), p2, 4, "agent-b");
  EXPECT_EQ(same.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_EQ(same.finished.restored_tokens, 40);
}

// Tenants: KV records are keyed by the salted chain, so after a restart a
// tenant's stored blocks restore for that tenant only; another tenant (or
// an unsalted request) with the same prompt recomputes it.
TEST_F(StoreKvTierTest, SaltedRecordsRestoreOnlyForTheirSalt) {
  auto tier = Tier(store_.get());
  auto turn = [&](std::vector<int32_t> prompt, const std::string& salt, const std::string& agent) {
    auto e = MakeEngine(tier);
    engine::EngineRequest r = Greedy(std::move(prompt), 4, agent);
    r.cache_salt = salt;
    Done d = Collect(e->Submit(std::move(r)).value());
    e->Stop();
    EXPECT_TRUE(store_->Flush().ok());
    return d;
  };
  const std::vector<int32_t> p = Prompt(40);
  Done first = turn(p, "4:acme", "acme/a");
  EXPECT_EQ(first.finished.cached_tokens, 0);
  std::vector<int32_t> p2 = p;
  p2.push_back(1);
  Done zeta = turn(p2, "4:zeta", "zeta/a");
  EXPECT_EQ(zeta.finished.cached_tokens, 0);
  EXPECT_EQ(zeta.finished.cache_source, engine::CacheSource::kNone);
  Done plain = turn(p2, "", "b");
  EXPECT_EQ(plain.finished.cached_tokens, 0);
  Done acme = turn(p2, "4:acme", "acme/a");
  EXPECT_EQ(acme.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_EQ(acme.finished.restored_tokens, 40);
  EXPECT_EQ(acme.tokens, zeta.tokens);
  EXPECT_EQ(acme.tokens, plain.tokens);
  // The chain the store keeps for acme's agent is the salted one.
  auto chain = store_->GetKvChain("acme/a", tier->fingerprint());
  ASSERT_TRUE(chain.ok());
  ASSERT_GE(chain->size(), 10u);
  EXPECT_EQ(chain->front().hash,
            cache::HashFullBlocks(p, kBlock, cache::ChainRoot("4:acme")).front());
}

// The tier of a real backend, tagged with its kv_format and element size
// (as api/served_model.cc builds it).
std::shared_ptr<StoreKvTier> BackendTier(AgentStore* store, cache::KvDtype kv) {
  const model::ModelConfig c = SmallConfig(model::Architecture::kQwen3);
  auto b = backend::cpu::CpuBackend::Create(c, RandomWeights(c, 21),
                                            backend::cpu::CpuBackendOptions{1, kv});
  EXPECT_TRUE(b.ok());
  auto t = StoreKvTier::Create(store, kModelFp, (*b)->kv_format(), kBlock, (*b)->kv_element_size());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::shared_ptr<StoreKvTier>(std::move(t).value());
}

// An fp8 KV record never loads into an fp32 cache, nor the reverse; each
// restores into its own dtype with the output of a full prefill.
TEST_F(StoreKvTierTest, Fp8AndF32RecordsNeverMix) {
  auto fp8 = BackendTier(store_.get(), cache::KvDtype::kFP8E4M3);
  auto f32 = BackendTier(store_.get(), cache::KvDtype::kF32);
  EXPECT_FALSE(fp8->fingerprint() == f32->fingerprint());
  const std::vector<int32_t> p = Prompt(40);
  Turn(fp8, p, 4, "agent-8", cache::KvDtype::kFP8E4M3);
  std::vector<int32_t> p2 = p;
  p2.push_back(1);
  Done as_f32 = Turn(f32, p2, 4, "agent-8", cache::KvDtype::kF32);
  EXPECT_EQ(as_f32.finished.cached_tokens, 0);
  EXPECT_EQ(as_f32.tokens, Turn(nullptr, p2, 4, "", cache::KvDtype::kF32).tokens);
  // (That turn stored f32 records of the same agent beside the fp8 ones.)
  std::vector<int32_t> p3 = p2;
  p3.insert(p3.end(), as_f32.tokens.begin(), as_f32.tokens.end());
  p3.push_back(2);
  Done as_fp8 = Turn(fp8, p3, 4, "agent-8", cache::KvDtype::kFP8E4M3);
  EXPECT_EQ(as_fp8.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_EQ(as_fp8.finished.restored_tokens, 40);  // its own records only
  EXPECT_EQ(as_fp8.tokens, Turn(nullptr, p3, 4, "", cache::KvDtype::kFP8E4M3).tokens);
  // And an f32 agent's records never reach an fp8 cache.
  Turn(f32, Prompt(40, 3), 4, "agent-f", cache::KvDtype::kF32);
  std::vector<int32_t> q = Prompt(40, 3);
  q.push_back(5);
  Done f_as_fp8 = Turn(fp8, q, 4, "agent-f", cache::KvDtype::kFP8E4M3);
  EXPECT_EQ(f_as_fp8.finished.cached_tokens, 0);
}

TEST_F(StoreKvTierTest, CorruptRecordEndsPrefixAndOutputIsStillRight) {
  auto tier = Tier(store_.get());
  const std::vector<int32_t> p = Prompt(48);
  Turn(tier, p, 2, "agent-c");
  // Flip one byte in the KV record of block 5.
  const std::vector<cache::BlockHash> hashes = cache::HashFullBlocks(p, kBlock);
  const std::string key = KvKey(tier->fingerprint(), hashes[5]);
  {
    auto st = store_->env().Write([&](LmdbEnv::WriteTxn& t) -> Status {
      ASSIGN_OR_RETURN(auto v, t.Get(Db::kKv, key));
      if (!v) return NotFound("record");
      std::string bad(*v);
      bad[bad.size() / 2] ^= 0x40;
      return t.Put(Db::kKv, key, bad);
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  std::vector<int32_t> p2 = p;
  p2.push_back(2);
  auto e = MakeEngine(tier);
  Done restored = Collect(e->Submit(Greedy(p2, 6, "agent-c")).value());
  e->Drain();
  EXPECT_EQ(restored.finished.restored_tokens, 5 * kBlock);
  EXPECT_EQ(e->Stats().restore_problems, 1);
  Done reference = Turn(nullptr, p2, 6, "");
  EXPECT_EQ(restored.tokens, reference.tokens);
}

// A restore in many staging chunks (3 blocks each): every chunk lands in
// order, and a corrupt record in a later chunk ends the prefix there.
TEST_F(StoreKvTierTest, ChunkedRestoreSameOutputAndStopsAtCorruption) {
  auto tier = Tier(store_.get());
  const std::vector<int32_t> p = Prompt(100);
  Turn(tier, p, 2, "agent-k");
  std::vector<int32_t> p2 = p;
  p2.push_back(6);
  Done reference = Turn(nullptr, p2, 6, "");
  {
    auto e = MakeEngine(tier, 256, 3);
    Done restored = Collect(e->Submit(Greedy(p2, 6, "agent-k")).value());
    e->Drain();
    EXPECT_EQ(restored.finished.cache_source, engine::CacheSource::kDisk);
    EXPECT_EQ(restored.finished.restored_tokens, 100);  // 25 blocks in 9 chunks
    EXPECT_EQ(restored.tokens, reference.tokens);
    EXPECT_EQ(e->Stats().restore_problems, 0);
    EXPECT_GT(e->Stats().restore_load_seconds, 0.0);
  }
  // Block 13: the fifth chunk's second block.
  const std::vector<cache::BlockHash> hashes = cache::HashFullBlocks(p, kBlock);
  const std::string key = KvKey(tier->fingerprint(), hashes[13]);
  auto st = store_->env().Write([&](LmdbEnv::WriteTxn& t) -> Status {
    ASSIGN_OR_RETURN(auto v, t.Get(Db::kKv, key));
    if (!v) return NotFound("record");
    std::string bad(*v);
    bad[bad.size() / 3] ^= 0x10;
    return t.Put(Db::kKv, key, bad);
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto e = MakeEngine(tier, 256, 3);
  Done restored = Collect(e->Submit(Greedy(p2, 6, "agent-k")).value());
  e->Drain();
  EXPECT_EQ(restored.finished.restored_tokens, 13 * kBlock);
  EXPECT_EQ(e->Stats().restore_problems, 1);
  EXPECT_EQ(restored.tokens, reference.tokens);
}

// The same chunked restore with copies into the pool that finish late (as a
// GPU's asynchronous ones): the output is still a recompute's, and no
// staging slot is refilled before the copy out of it is done.
TEST_F(StoreKvTierTest, ChunkedRestoreThroughLateCopiesSameOutput) {
  auto tier = Tier(store_.get());
  const std::vector<int32_t> p = Prompt(100);
  Turn(tier, p, 2, "agent-k");
  std::vector<int32_t> p2 = p;
  p2.push_back(6);
  Done reference = Turn(nullptr, p2, 6, "");
  auto e = MakeEngine(tier, 256, 3, 0, cache::KvDtype::kF32, /*deferred_write_polls=*/3);
  Done restored = Collect(e->Submit(Greedy(p2, 6, "agent-k")).value());
  e->Drain();
  EXPECT_EQ(restored.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_EQ(restored.finished.restored_tokens, 100);  // 25 blocks in 9 chunks
  EXPECT_EQ(restored.tokens, reference.tokens);
  EXPECT_EQ(e->Stats().restore_problems, 0);
  EXPECT_GT(e->Stats().restore_write_done_seconds, 0.0);
  std::unique_ptr<backend::Backend> b = e->ReleaseBackend();
  auto* dev = dynamic_cast<agentkv::testing::DeferredWriteBackend*>(b.get());
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->writes_started(), 9);
  EXPECT_EQ(dev->writes_pending(), 0u);
  EXPECT_EQ(dev->source_changes(), 0);
}

// Several agents restoring at once through three staging slots, one of them
// cancelled mid-load: the others restore in full, nothing leaks.
TEST_F(StoreKvTierTest, ConcurrentChunkedRestoresAndCancel) {
  auto tier = Tier(store_.get());
  std::vector<std::vector<int32_t>> prompts;
  for (int a = 0; a < 4; ++a) {
    prompts.push_back(Prompt(80, 11 * a + 1));
    Turn(tier, prompts.back(), 2, "agent-m" + std::to_string(a));
    prompts.back().push_back(5);
  }
  auto e = MakeEngine(tier, 256, 2);
  std::vector<engine::RequestHandle> hs;
  for (int a = 0; a < 4; ++a)
    hs.push_back(e->Submit(Greedy(prompts[a], 4, "agent-m" + std::to_string(a))).value());
  e->Cancel(hs[2].id);
  for (int a = 0; a < 4; ++a) {
    Done d = Collect(hs[a]);
    if (a == 2) continue;
    EXPECT_EQ(d.finished.restored_tokens, 80) << a;
    EXPECT_EQ(d.tokens, Turn(nullptr, prompts[a], 4, "").tokens) << a;
  }
  e->Drain();
  EXPECT_EQ(e->Stats().loading, 0);
  e->Stop();
}

// A tier that holds the blocks handed to it (and with them the engine's
// save staging) until Open(), then passes everything to the store's tier:
// it lets a test decide when staging comes back.
class GatedTier : public cache::KvTier {
 public:
  explicit GatedTier(std::shared_ptr<StoreKvTier> inner) : inner_(std::move(inner)) {}
  const char* source_name() const override { return inner_->source_name(); }
  Result<cache::KvTierLoad> Load(std::span<const int32_t> tokens, const cache::BlockHash& root,
                                 int block_size, int32_t first_block, int32_t max_blocks) override {
    return inner_->Load(tokens, root, block_size, first_block, max_blocks);
  }
  void Save(const std::string& agent_key, uint32_t first_index,
            std::vector<cache::KvTierBlock> blocks) override {
    std::lock_guard<std::mutex> lock(mu_);
    saves_ += blocks.size();
    if (!open_) {
      held_.push_back({agent_key, first_index, std::move(blocks)});
      return;
    }
    inner_->Save(agent_key, first_index, std::move(blocks));
  }
  Status Flush() override { return inner_->Flush(); }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    for (Held& h : held_) inner_->Save(h.agent, h.first, std::move(h.blocks));
    held_.clear();
  }
  size_t saves() const {
    std::lock_guard<std::mutex> lock(mu_);
    return saves_;
  }

 private:
  struct Held {
    std::string agent;
    uint32_t first;
    std::vector<cache::KvTierBlock> blocks;
  };
  std::shared_ptr<StoreKvTier> inner_;
  mutable std::mutex mu_;
  bool open_ = false;
  std::vector<Held> held_;
  size_t saves_ = 0;
};

// Save staging of two blocks: a turn of ten stages two, the rest wait in
// the pool until staging comes back, then all ten are stored.
TEST_F(StoreKvTierTest, TurnLargerThanSaveStagingIsSavedWhole) {
  auto store_tier = Tier(store_.get());
  auto gate = std::make_shared<GatedTier>(store_tier);
  auto e = MakeEngine(gate, 256, 0, 2);
  const std::vector<int32_t> p = Prompt(40);
  Collect(e->Submit(Greedy(p, 2, "agent-s")).value());
  for (int i = 0; i < 200 && gate->saves() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(gate->saves(), 2u);  // staging is out: the other 8 wait
  gate->Open();
  e->Drain();  // idle only once every block is handed over
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(e->Stats().save_dropped_blocks, 0);
  EXPECT_EQ(e->Stats().saved_blocks, 10);
  auto chain = store_->GetKvChain("agent-s", store_tier->fingerprint());
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->size(), 10u);
  e->Stop();
  std::vector<int32_t> p2 = p;
  p2.push_back(9);
  Done restored = Turn(store_tier, p2, 3, "agent-s");
  EXPECT_EQ(restored.finished.restored_tokens, 40);
  EXPECT_EQ(restored.tokens, Turn(nullptr, p2, 3, "").tokens);
}

// Stopping the engine right after a turn (shutdown, hot-swap) still hands
// the whole turn over, waiting for staging to come back.
TEST_F(StoreKvTierTest, StopPersistsWhatWaitsForSaveStaging) {
  auto tier = Tier(store_.get());
  auto e = MakeEngine(tier, 256, 0, 2);
  Collect(e->Submit(Greedy(Prompt(60), 2, "agent-t")).value());
  e->Stop();
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(e->Stats().save_dropped_blocks, 0);
  auto chain = store_->GetKvChain("agent-t", tier->fingerprint());
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->size(), 15u);
}

// A drain that times out leaves the request running; Stop then cuts it off
// and its KV so far (prompt and output) is stored, and resumes.
TEST_F(StoreKvTierTest, DrainDeadlineThenStopSavesTheRunningTurn) {
  auto tier = Tier(store_.get());
  auto e = MakeEngine(tier);
  const std::vector<int32_t> prompt = Prompt(41);
  engine::RequestHandle h = e->Submit(Greedy(prompt, 100000, "agent-d")).value();
  // Let it prefill and produce some output first.
  std::vector<int32_t> got;
  while (got.size() < 12) {
    engine::RequestOutput ev = h.stream->Pop();
    ASSERT_EQ(ev.kind, engine::RequestOutput::Kind::kDelta);
    got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
  }
  EXPECT_FALSE(e->Drain(0.05));
  e->Stop();
  Done rest = Collect(h);
  EXPECT_TRUE(rest.finished.cancelled);
  got.insert(got.end(), rest.tokens.begin(), rest.tokens.end());
  ASSERT_TRUE(store_->Flush().ok());
  auto chain = store_->GetKvChain("agent-d", tier->fingerprint());
  ASSERT_TRUE(chain.ok());
  // Every full block of the prompt and of the output it computed.
  EXPECT_GE(chain->size(), (prompt.size() + got.size() - 1) / kBlock - 1);
  EXPECT_GT(chain->size() * kBlock, prompt.size());
  // The next turn (the cut-off output kept) resumes from the store.
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), got.begin(), got.end());
  next.push_back(7);
  Done resumed = Turn(tier, next, 4, "agent-d");
  EXPECT_EQ(resumed.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_GT(resumed.finished.restored_tokens, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(resumed.tokens, Turn(nullptr, next, 4, "").tokens);
}

// Blocks evicted from the pool while they wait for staging are not saved
// (and never read as something else): the stored chain ends before them.
TEST_F(StoreKvTierTest, BlocksEvictedWhileWaitingForStagingAreDropped) {
  auto store_tier = Tier(store_.get());
  auto gate = std::make_shared<GatedTier>(store_tier);
  auto e = MakeEngine(gate, 24, 0, 2);
  const std::vector<int32_t> pa = Prompt(40);
  Collect(e->Submit(Greedy(pa, 2, "agent-a")).value());
  // Another agent needs 21 of the 24 blocks: most of agent-a's go.
  Collect(e->Submit(Greedy(Prompt(80, 50), 2, "agent-b")).value());
  gate->Open();
  e->Drain();
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_GT(e->Stats().save_dropped_blocks, 0);
  auto chain = store_->GetKvChain("agent-a", store_tier->fingerprint());
  ASSERT_TRUE(chain.ok());
  EXPECT_GE(chain->size(), 2u);
  EXPECT_LT(chain->size(), 10u);
  e->Stop();
  std::vector<int32_t> p2 = pa;
  p2.push_back(9);
  Done restored = Turn(store_tier, p2, 3, "agent-a");
  EXPECT_EQ(restored.finished.restored_tokens, static_cast<int64_t>(chain->size()) * kBlock);
  EXPECT_EQ(restored.tokens, Turn(nullptr, p2, 3, "").tokens);
}

TEST_F(StoreKvTierTest, SmallPoolRestoresWhatFitsAndStaysCorrect) {
  auto tier = Tier(store_.get());
  const std::vector<int32_t> p = Prompt(100);
  Turn(tier, p, 2, "agent-d");
  std::vector<int32_t> p2 = p;
  p2.push_back(4);
  // 40 blocks: the 26-block prompt fits with room to generate.
  auto e = MakeEngine(tier, 40);
  Done restored = Collect(e->Submit(Greedy(p2, 8, "agent-d")).value());
  Done reference = Turn(nullptr, p2, 8, "");
  EXPECT_EQ(restored.tokens, reference.tokens);
  EXPECT_EQ(restored.finished.restored_tokens, 100);
}

TEST_F(StoreKvTierTest, DeletedAgentsBlocksAreWrittenAgainForAnother) {
  auto tier = Tier(store_.get());
  const std::vector<int32_t> p = Prompt(40);
  auto e = MakeEngine(tier);
  Collect(e->Submit(Greedy(p, 2, "agent-x")).value());
  // The turn's KV is handed to the store when the engine retires the
  // sequence, just after its last event: wait until its chain is stored.
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(store_->Flush().ok());
    auto chain = store_->GetKvChain("agent-x", tier->fingerprint());
    if (chain.ok() && chain->size() == 10) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // DELETE /v1/agents/agent-x: the store drops its blocks, the engine its cache.
  const Status removed = store_->RemoveAgent("agent-x");
  ASSERT_TRUE(removed.ok()) << removed.ToString();
  e->DropAgent("agent-x");
  // The same content for another agent (still resident in the pool).
  Collect(e->Submit(Greedy(p, 2, "agent-y")).value());
  e->Stop();
  ASSERT_TRUE(store_->Flush().ok());
  std::vector<int32_t> p2 = p;
  p2.push_back(3);
  Done resumed = Turn(tier, p2, 2, "agent-y");
  EXPECT_EQ(resumed.finished.cache_source, engine::CacheSource::kDisk);
  EXPECT_EQ(resumed.finished.restored_tokens, 40);
}

TEST(StoreKvTierFullTest, FullStoreLosesKvButNeverAService) {
  // A map that cannot grow past 512 KiB, and four 400-token agents of
  // ~300 KiB of KV each (3 layers x K,V x 2 heads x 16 dims x 4 bytes = 768
  // bytes per token). Writes fail or evict behind the engine's back; every
  // turn keeps its output.
  TempDir dir;
  StoreOptions o;
  o.sync = false;
  o.initial_map_bytes = 256 << 10;
  o.max_map_bytes = 512 << 10;
  auto st = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto tier = Tier(st->get());
  std::vector<std::vector<int32_t>> outputs;
  for (int agent = 0; agent < 4; ++agent) {
    auto e = MakeEngine(tier);
    Done d =
        Collect(e->Submit(Greedy(Prompt(400, agent), 4, "full-" + std::to_string(agent))).value());
    EXPECT_FALSE(d.finished.cancelled);
    EXPECT_EQ(d.tokens.size(), 4u);
    Done ref = Collect(MakeEngine(nullptr)->Submit(Greedy(Prompt(400, agent), 4)).value());
    EXPECT_EQ(d.tokens, ref.tokens);
  }
  const Status flushed = (*st)->Flush();
  const KvStoreStats ks = (*st)->kv_stats();
  // Either a write failed and was reported, or eviction made room each time.
  EXPECT_TRUE(!flushed.ok() || ks.blocks_evicted > 0) << flushed.ToString();
  if (!flushed.ok()) {
    EXPECT_EQ(flushed.code(), StatusCode::kResourceExhausted);
  }
  // What is stored is intact, and a resume still serves the right output.
  auto report = (*st)->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  std::vector<int32_t> p2 = Prompt(400, 3);
  p2.push_back(7);
  Done resumed = Collect(MakeEngine(tier)->Submit(Greedy(p2, 4, "full-3")).value());
  Done ref = Collect(MakeEngine(nullptr)->Submit(Greedy(p2, 4)).value());
  EXPECT_EQ(resumed.tokens, ref.tokens);
}

TEST_F(StoreKvTierTest, CancelWhileLoadingFinishesCancelled) {
  auto tier = Tier(store_.get());
  const std::vector<int32_t> p = Prompt(60);
  Turn(tier, p, 2, "agent-e");
  auto e = MakeEngine(tier);
  std::vector<int32_t> p2 = p;
  p2.push_back(9);
  auto h = e->Submit(Greedy(p2, 50, "agent-e")).value();
  e->Cancel(h.id);
  Done d = Collect(h);
  EXPECT_TRUE(d.finished.cancelled || d.finished.finish == engine::FinishReason::kLength);
  e->Drain();
  EXPECT_EQ(e->Stats().loading, 0);
  for (const cache::BlockPoolStats& ps : e->Stats().pools) EXPECT_EQ(ps.in_use, 0);
}

}  // namespace
}  // namespace agentkv::store
