#include "store/agent_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "store/kv_block_codec.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::Fp;
using testing::MakeChainWrite;
using testing::TempDir;
using testing::Tokens;

StoreOptions Fast() {
  StoreOptions o;
  o.sync = false;
  o.worker_threads = 2;
  return o;
}

TEST(AgentStoreTest, TurnsAreNumberedAndSurviveReopen) {
  TempDir dir;
  {
    auto s = AgentStore::Open(dir.path(), Fast());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(*(*s)->AppendTurn("a1", R"([{"role":"user","content":"hi"}])", "sp1"), 1u);
    EXPECT_EQ(*(*s)->AppendTurn("a1", R"([{"role":"assistant","content":"yo"}])"), 2u);
    EXPECT_EQ(*(*s)->AppendTurn("b2", R"([])"), 1u);
  }
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  auto h = (*s)->GetHistory("a1");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[0].number, 1u);
  EXPECT_EQ((*h)[1].messages_json, R"([{"role":"assistant","content":"yo"}])");
  auto m = (*s)->GetAgent("a1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->turns, 2u);
  EXPECT_EQ(m->system_prompt_hash, "sp1");
  EXPECT_GE(m->last_used_ms, m->created_ms);
  auto all = (*s)->ListAgents();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
  EXPECT_EQ((*s)->GetAgent("nobody").status().code(), StatusCode::kNotFound);
}

TEST(AgentStoreTest, ListsAgentsAPageAtATime) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  for (const char* id : {"b", "a", "c", "d"}) ASSERT_TRUE((*s)->AppendTurn(id, "[]").ok());
  auto page = (*s)->ListAgents("", 2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, "a");
  EXPECT_EQ((*page)[1].id, "b");
  page = (*s)->ListAgents("b", 2);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, "c");
  EXPECT_EQ((*page)[1].id, "d");
  EXPECT_TRUE((*s)->ListAgents("d", 2)->empty());
  // A cursor that is not an agent id starts after where it would sort.
  page = (*s)->ListAgents("bb", 10);
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, "c");
  EXPECT_TRUE((*s)->ListAgents("", 0)->empty());
  EXPECT_EQ((*s)->ListAgents()->size(), 4u);
  // Within a prefix (one tenant's ids): only those, from the cursor on.
  for (const char* id : {"t/x", "t/y", "t/z", "u/a"}) ASSERT_TRUE((*s)->AppendTurn(id, "[]").ok());
  page = (*s)->ListAgents("", 10, "t/");
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].id, "t/x");
  page = (*s)->ListAgents("t/x", 1, "t/");
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ((*page)[0].id, "t/y");
  EXPECT_TRUE((*s)->ListAgents("t/z", 10, "t/")->empty());
  EXPECT_EQ((*s)->ListAgents("a", 10, "t/")->size(), 3u);  // a cursor before the prefix
  EXPECT_TRUE((*s)->ListAgents("u", 10, "t/")->empty());   // and one after it
}

TEST(AgentStoreTest, RejectsBadInput) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->AppendTurn("", "[]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->AppendTurn(std::string("a\0b", 3), "[]").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->AppendTurn(std::string(300, 'x'), "[]").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*s)->AppendTurn("a", "{not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ModelFingerprint::FromHex("abc").ok());
  EXPECT_FALSE(ModelFingerprint::FromHex(std::string(31, 'a') + "g").ok());
  EXPECT_EQ(ModelFingerprint::FromHex(std::string(32, 'A'))->Hex(), std::string(32, 'a'));
}

TEST(AgentStoreTest, ExtrasAndModels) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->PutAgentExtras("a", {{"k", 1}}).code(), StatusCode::kNotFound);
  ASSERT_TRUE((*s)->AppendTurn("a", "[]").ok());
  ASSERT_TRUE((*s)->PutAgentExtras("a", {{"k", 1}}).ok());
  EXPECT_EQ((*s)->GetAgent("a")->extras["k"], 1);
  ASSERT_TRUE((*s)->PutModel(Fp('1'), R"({"arch":"llama"})").ok());
  EXPECT_EQ(*(*s)->GetModel(Fp('1')), R"({"arch":"llama"})");
  EXPECT_EQ((*s)->GetModel(Fp('2')).status().code(), StatusCode::kNotFound);
}

TEST(AgentStoreTest, KvRoundTripAndLongestPrefix) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  const auto tokens = Tokens(16 * 6);
  auto w = MakeChainWrite("a", Fp('1'), tokens, 16, 4096);
  const auto expected = w;
  (*s)->PutKvBlocks(std::move(w));
  ASSERT_TRUE((*s)->Flush().ok());

  // The request continues past what is stored: the stored 6 blocks come back.
  auto longer = tokens;
  for (int i = 0; i < 40; ++i) longer.push_back(9000 + i);
  auto p = (*s)->LoadKvPrefixForTokens(Fp('1'), longer, 16);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->problem.ok());
  ASSERT_EQ(p->blocks.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(p->blocks[i].data, expected.blocks[i].data) << i;
    EXPECT_EQ(p->blocks[i].tokens, expected.blocks[i].tokens);
  }
  // A request that diverges in block 3 gets blocks 0..2.
  auto diverged = tokens;
  diverged[3 * 16 + 5] = 1;
  p = (*s)->LoadKvPrefixForTokens(Fp('1'), diverged, 16);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->blocks.size(), 3u);
  auto chain = (*s)->GetKvChain("a", Fp('1'));
  ASSERT_TRUE(chain.ok());
  ASSERT_EQ(chain->size(), 6u);
  EXPECT_EQ((*chain)[5].tokens, expected.blocks[5].tokens);
  EXPECT_EQ((*s)->kv_stats().blocks_written, 6u);
}

TEST(AgentStoreTest, FingerprintIsolation) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  const auto tokens = Tokens(16 * 4);
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('a'), tokens, 16, 2048));
  ASSERT_TRUE((*s)->Flush().ok());
  auto other = (*s)->LoadKvPrefixForTokens(Fp('b'), tokens, 16);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->blocks.empty());
  EXPECT_TRUE((*s)->GetKvChain("a", Fp('b'))->empty());
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('a'), tokens, 16)->blocks.size(), 4u);

  // A record copied under B's key (same hash) is refused: its header names A.
  const auto hashes = cache::HashFullBlocks(tokens, 16);
  ASSERT_TRUE((*s)->env()
                  .Write([&](LmdbEnv::WriteTxn& t) -> Status {
                    ASSIGN_OR_RETURN(auto v, t.Get(Db::kKv, KvKey(Fp('a'), hashes[0])));
                    std::string copy(*v);
                    return t.Put(Db::kKv, KvKey(Fp('b'), hashes[0]), copy);
                  })
                  .ok());
  other = (*s)->LoadKvPrefixForTokens(Fp('b'), tokens, 16);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->blocks.empty());
  EXPECT_EQ(other->problem.code(), StatusCode::kCorruption);
  EXPECT_NE(other->problem.message().find("kv fp bbbb"), std::string::npos)
      << other->problem.message();
}

TEST(AgentStoreTest, SharedPrefixStoredOnceAndRmKeepsShared) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  // Two agents share 3 system-prompt blocks, then each has 2 of its own.
  auto ta = Tokens(16 * 5);
  auto tb = ta;
  for (int i = 48; i < 80; ++i) tb[i] = 20000 + i;
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), ta, 16, 2048));
  (*s)->PutKvBlocks(MakeChainWrite("b", Fp('1'), tb, 16, 2048));
  ASSERT_TRUE((*s)->Flush().ok());
  ASSERT_TRUE((*s)->AppendTurn("a", "[]").ok());
  ASSERT_TRUE((*s)->AppendTurn("b", "[]").ok());
  EXPECT_EQ((*s)->kv_stats().blocks_written, 7u);
  auto sum = (*s)->Summarize("a");
  ASSERT_TRUE(sum.ok());
  ASSERT_EQ(sum->kv.size(), 1u);
  EXPECT_EQ(sum->kv[0].chain_blocks, 5u);
  EXPECT_EQ(sum->kv[0].stored_blocks, 5u);

  ASSERT_TRUE((*s)->RemoveAgent("a").ok());
  EXPECT_EQ((*s)->GetAgent("a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*s)->GetHistory("a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('1'), ta, 16)->blocks.size(), 3u);
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('1'), tb, 16)->blocks.size(), 5u);
  EXPECT_EQ((*s)->RemoveAgent("a").code(), StatusCode::kNotFound);
  ASSERT_TRUE((*s)->RemoveAgent("b").ok());
  auto r = (*s)->env().BeginRead();
  EXPECT_EQ(*r->Count(Db::kKv), 0u);
  EXPECT_EQ(*r->Count(Db::kKvMeta), 0u);
  EXPECT_EQ(*r->Count(Db::kChains), 0u);
}

TEST(AgentStoreTest, KvWriteAfterRemovalIsDroppedUntilTheIdIsCreatedAgain) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  auto t = Tokens(16 * 3);
  ASSERT_TRUE((*s)->AppendTurn("a", "[]").ok());
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t, 16, 1024));
  ASSERT_TRUE((*s)->Flush().ok());
  ASSERT_TRUE((*s)->RemoveAgent("a").ok());
  EXPECT_TRUE((*s)->IsTombstoned("a"));
  // A save that was still in flight when the agent was deleted: neither its
  // chain nor its blocks (the conversation's tokens) come back.
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t, 16, 1024));
  // Another agent's write is untouched.
  auto other = Tokens(16 * 2, 500);
  (*s)->PutKvBlocks(MakeChainWrite("b", Fp('1'), other, 16, 1024));
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_TRUE((*s)->GetKvChain("a", Fp('1'))->empty());
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('1'), t, 16)->blocks.size(), 0u);
  EXPECT_EQ((*s)->GetKvChain("b", Fp('1'))->size(), 2u);
  EXPECT_EQ((*s)->kv_stats().tombstoned_writes, 1u);
  {
    auto r = (*s)->env().BeginRead();
    EXPECT_EQ(*r->Count(Db::kKv), 2u);
  }
  // The id created again is a new agent: its KV is written.
  ASSERT_TRUE((*s)->AppendTurn("a", "[]").ok());
  EXPECT_FALSE((*s)->IsTombstoned("a"));
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t, 16, 1024));
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_EQ((*s)->GetKvChain("a", Fp('1'))->size(), 3u);
}

TEST(AgentStoreTest, KvWritesQueuedBeforeRemovalNeverOutliveIt) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->AppendTurn("a", "[]").ok());
  // Many turns' writes queued (each extends the chain by a block), then the
  // removal right behind them: whichever the writer reached first (written
  // then removed, or dropped), nothing of the agent is left afterwards.
  const auto t = Tokens(16 * 50);
  for (uint32_t i = 0; i < 50; ++i) {
    const std::vector<int32_t> turn(t.begin(), t.begin() + 16 * (i + 1));
    (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), turn, 16, 4096, /*first_block=*/i));
  }
  ASSERT_TRUE((*s)->RemoveAgent("a").ok());
  ASSERT_TRUE((*s)->Flush().ok());
  auto r = (*s)->env().BeginRead();
  EXPECT_EQ(*r->Count(Db::kKv), 0u);
  EXPECT_EQ(*r->Count(Db::kKvMeta), 0u);
  EXPECT_EQ(*r->Count(Db::kChains), 0u);
}

TEST(AgentStoreTest, AppendOnlyWritesNewBlocksAndDivergenceCutsChain) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  auto t = Tokens(16 * 4);
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t, 16, 1024));
  ASSERT_TRUE((*s)->Flush().ok());
  // Next turn: two more blocks, written from index 4 only.
  auto t2 = t;
  for (int i = 0; i < 32; ++i) t2.push_back(30000 + i);
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t2, 16, 1024, /*first_block=*/4));
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_EQ((*s)->kv_stats().blocks_written, 6u);
  EXPECT_EQ((*s)->GetKvChain("a", Fp('1'))->size(), 6u);
  // The conversation was edited at block 2: the chain becomes 3 blocks.
  auto t3 = t;
  t3.resize(48);
  t3[40] = 7;
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t3, 16, 1024, /*first_block=*/2));
  ASSERT_TRUE((*s)->Flush().ok());
  auto chain = (*s)->GetKvChain("a", Fp('1'));
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_EQ((*chain)[2].tokens[8], 7);
}

TEST(AgentStoreTest, LinkOnlyWriteReusesStoredBlock) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  auto t = Tokens(32);
  (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), t, 16, 1024));
  auto link = MakeChainWrite("b", Fp('1'), t, 16, 1024);
  for (auto& b : link.blocks) b.data.clear();
  (*s)->PutKvBlocks(std::move(link));
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_EQ((*s)->kv_stats().blocks_written, 2u);
  ASSERT_TRUE((*s)->RemoveAgent("a").ok());
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('1'), t, 16)->blocks.size(), 2u);
}

TEST(AgentStoreTest, QueueOverBoundDropsOldestAndCounts) {
  TempDir dir;
  StoreOptions o = Fast();
  o.kv_queue_max_bytes = 64 << 10;
  auto s = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(s.ok());
  // 100 writes of ~32 KiB against a 64 KiB queue: whether the writer keeps
  // up depends on timing (kv_write_queue_test checks the drops without a
  // writer racing); here every write is either written or counted as
  // dropped, none blocks, and the newest is never dropped.
  for (int i = 0; i < 100; ++i) {
    (*s)->PutKvBlocks(
        MakeChainWrite("a" + std::to_string(i), Fp('1'), Tokens(32, 1000 * i), 16, 16384, 0, i));
  }
  ASSERT_TRUE((*s)->Flush().ok());
  const auto st = (*s)->kv_stats();
  EXPECT_EQ(st.queue.pending_writes, 0u);
  EXPECT_EQ(st.blocks_written / 2 + st.queue.dropped_writes, 100u);
  // The last write is never the one dropped.
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('1'), Tokens(32, 99000), 16)->blocks.size(), 2u);
}

TEST(AgentStoreTest, ConcurrentTurnsAndKvWrites) {
  TempDir dir;
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  std::vector<std::thread> threads;
  for (int a = 0; a < 4; ++a) {
    threads.emplace_back([&, a] {
      for (int t = 0; t < 25; ++t) {
        ASSERT_TRUE((*s)->AppendTurn("agent" + std::to_string(a), "[]").ok());
        (*s)->PutKvBlocks(MakeChainWrite("agent" + std::to_string(a), Fp('1'),
                                         Tokens(16 * (t + 1), a * 100000), 16, 512, t, a));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE((*s)->Flush().ok());
  for (int a = 0; a < 4; ++a) {
    EXPECT_EQ((*s)->GetAgent("agent" + std::to_string(a))->turns, 25u);
    EXPECT_EQ((*s)->GetKvChain("agent" + std::to_string(a), Fp('1'))->size(), 25u);
  }
  auto v = (*s)->Verify();
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok());
  EXPECT_EQ(v->kv_blocks, 100u);
}

TEST(AgentStoreTest, ReadOnlyOpenSeesDataAndRefusesWrites) {
  TempDir dir;
  {
    auto s = AgentStore::Open(dir.path(), Fast());
    ASSERT_TRUE((*s)->AppendTurn("a", "[1]").ok());
  }
  StoreOptions ro = Fast();
  ro.read_only = true;
  auto s = AgentStore::Open(dir.path(), ro);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->GetHistory("a")->size(), 1u);
  EXPECT_FALSE((*s)->AppendTurn("a", "[]").ok());
  TempDir empty;
  EXPECT_EQ(AgentStore::Open(empty.sub("none"), ro).status().code(), StatusCode::kNotFound);
}

TEST(AgentStoreTest, CompactKeepsEverythingAndRefusesWhileOpen) {
  TempDir dir;
  {
    auto s = AgentStore::Open(dir.path(), Fast());
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE((*s)->AppendTurn("a" + std::to_string(i), "[]").ok());
      (*s)->PutKvBlocks(
          MakeChainWrite("a" + std::to_string(i), Fp('1'), Tokens(64, i * 1000), 16, 8192, 0, i));
    }
    ASSERT_TRUE((*s)->Flush().ok());
    for (int i = 0; i < 15; ++i) ASSERT_TRUE((*s)->RemoveAgent("a" + std::to_string(i)).ok());
    EXPECT_EQ(AgentStore::Compact(dir.path()).code(), StatusCode::kIoError);
  }
  const auto before = std::filesystem::file_size(dir.sub("data.mdb"));
  ASSERT_TRUE(AgentStore::Compact(dir.path()).ok());
  const auto after = std::filesystem::file_size(dir.sub("data.mdb"));
  EXPECT_LT(after, before);
  auto s = AgentStore::Open(dir.path(), Fast());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->ListAgents()->size(), 5u);
  EXPECT_EQ((*s)->LoadKvPrefixForTokens(Fp('1'), Tokens(64, 19000), 16)->blocks.size(), 4u);
  EXPECT_TRUE((*s)->Verify()->ok());
}

}  // namespace
}  // namespace agentkv::store
