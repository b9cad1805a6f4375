// The HistoryStore contract, run on both implementations (the LMDB
// AgentStore and the MemoryHistoryStore): turn numbering, agent metadata,
// NotFound for unknown agents, input validation, paged and prefixed
// listing, removal.
#include "store/history_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "store/agent_store.h"
#include "store/memory_history_store.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::Fp;
using testing::TempDir;

enum class Kind { kLmdb, kMemory };

class HistoryStoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kMemory) {
      store_ = std::make_unique<MemoryHistoryStore>(64ull << 20);
      return;
    }
    StoreOptions o;
    o.sync = false;
    o.worker_threads = 2;
    auto s = AgentStore::Open(dir_.path(), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  void Append(const std::string& id, const std::string& json = "[]") {
    ASSERT_TRUE(store_->AppendTurn(id, json, "").ok()) << id;
  }

  TempDir dir_;
  std::unique_ptr<HistoryStore> store_;
};

TEST_P(HistoryStoreTest, TurnsAreNumberedAndTheAgentRemembered) {
  EXPECT_EQ(*store_->AppendTurn("a1", R"([{"role":"user","content":"hi"}])", "sp1"), 1u);
  EXPECT_EQ(*store_->AppendTurn("a1", R"([{"role":"assistant","content":"yo"}])", "sp2"), 2u);
  EXPECT_EQ(*store_->AppendTurn("b2", "[]", ""), 1u);
  auto h = store_->GetHistory("a1");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[0].number, 1u);
  EXPECT_EQ((*h)[1].number, 2u);
  EXPECT_EQ((*h)[1].messages_json, R"([{"role":"assistant","content":"yo"}])");
  auto m = store_->GetAgent("a1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->id, "a1");
  EXPECT_EQ(m->turns, 2u);
  EXPECT_EQ(m->system_prompt_hash, "sp1");  // recorded when created
  EXPECT_GT(m->created_ms, 0);
  EXPECT_GE(m->last_used_ms, m->created_ms);
  EXPECT_EQ(store_->ListAgents()->size(), 2u);
}

TEST_P(HistoryStoreTest, UnknownAgentsAreNotFound) {
  Append("known");
  EXPECT_EQ(store_->GetAgent("nobody").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->GetHistory("nobody").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->RemoveAgent("nobody").code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->GetKvChain("nobody", Fp('a'))->empty());
}

TEST_P(HistoryStoreTest, RejectsBadIdsAndTurnsAndCreatesNothing) {
  EXPECT_EQ(store_->AppendTurn("", "[]", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->AppendTurn(std::string("a\0b", 3), "[]", "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->AppendTurn(std::string(300, 'x'), "[]", "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->AppendTurn("a", "{not json", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetAgent("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetHistory("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->RemoveAgent("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->GetKvChain("", Fp('a')).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->ListAgents()->empty());
}

TEST_P(HistoryStoreTest, ListsAgentsAPageAtATime) {
  for (const char* id : {"b", "a", "c", "d"}) Append(id);
  auto page = store_->ListAgents("", 2, "");
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, "a");
  EXPECT_EQ((*page)[1].id, "b");
  page = store_->ListAgents("b", 2, "");
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, "c");
  EXPECT_EQ((*page)[1].id, "d");
  EXPECT_TRUE(store_->ListAgents("d", 2, "")->empty());
  // A cursor that is not an agent id starts after where it would sort.
  page = store_->ListAgents("bb", 10, "");
  ASSERT_EQ(page->size(), 2u);
  EXPECT_EQ((*page)[0].id, "c");
  EXPECT_TRUE(store_->ListAgents("", 0, "")->empty());
  EXPECT_EQ(store_->ListAgents()->size(), 4u);
  // Within a prefix (one tenant's ids): only those, from the cursor on.
  for (const char* id : {"t/x", "t/y", "t/z", "u/a"}) Append(id);
  page = store_->ListAgents("", 10, "t/");
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].id, "t/x");
  EXPECT_EQ((*page)[2].id, "t/z");
  page = store_->ListAgents("t/x", 1, "t/");
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ((*page)[0].id, "t/y");
  EXPECT_TRUE(store_->ListAgents("t/z", 10, "t/")->empty());
  EXPECT_EQ(store_->ListAgents("a", 10, "t/")->size(), 3u);  // a cursor before the prefix
  EXPECT_TRUE(store_->ListAgents("u", 10, "t/")->empty());   // and one after it
}

TEST_P(HistoryStoreTest, RemovedAgentIsGoneAndItsIdStartsAfresh) {
  Append("gone", R"(["one"])");
  Append("gone", R"(["two"])");
  Append("kept");
  ASSERT_TRUE(store_->RemoveAgent("gone").ok());
  EXPECT_EQ(store_->GetAgent("gone").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->GetHistory("gone").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->RemoveAgent("gone").code(), StatusCode::kNotFound);
  auto all = store_->ListAgents();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].id, "kept");
  EXPECT_EQ(*store_->AppendTurn("gone", R"(["again"])", ""), 1u);
  auto h = store_->GetHistory("gone");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 1u);
  EXPECT_EQ((*h)[0].messages_json, R"(["again"])");
}

INSTANTIATE_TEST_SUITE_P(Stores, HistoryStoreTest, ::testing::Values(Kind::kLmdb, Kind::kMemory),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kLmdb ? "Lmdb" : "Memory";
                         });

}  // namespace
}  // namespace agentkv::store
