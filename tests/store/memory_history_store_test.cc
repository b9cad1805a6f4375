// MemoryHistoryStore's own behaviour (the shared contract is in
// history_store_test.cc): the byte bound, dropping the least recently
// appended-to agents whole and telling on_drop, never the agent being
// appended to; removal frees its bytes; no KV.
#include "store/memory_history_store.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace agentkv::store {
namespace {

size_t OneTurnAgent(const std::string& id, const std::string& turn = "[]") {
  return MemoryHistoryStore::AgentBytes(id, "") + MemoryHistoryStore::TurnBytes(turn);
}

TEST(MemoryHistoryStoreTest, CountsItsBytes) {
  MemoryHistoryStore s(1 << 20);
  EXPECT_EQ(s.bytes(), 0u);
  ASSERT_TRUE(s.AppendTurn("a", R"(["x"])", "hash").ok());
  ASSERT_TRUE(s.AppendTurn("a", "[]", "ignored after the first").ok());
  EXPECT_EQ(s.bytes(), MemoryHistoryStore::AgentBytes("a", "hash") +
                           MemoryHistoryStore::TurnBytes(R"(["x"])") +
                           MemoryHistoryStore::TurnBytes("[]"));
  EXPECT_EQ(s.max_bytes(), 1u << 20);
}

TEST(MemoryHistoryStoreTest, DropsLeastRecentlyAppendedToFirstAndTellsWhom) {
  std::vector<std::string> dropped;
  MemoryHistoryStore s(OneTurnAgent("a") + OneTurnAgent("b"),
                       [&](const std::string& id) { dropped.push_back(id); });
  ASSERT_TRUE(s.AppendTurn("a", "[]", "").ok());
  ASSERT_TRUE(s.AppendTurn("b", "[]", "").ok());
  EXPECT_TRUE(dropped.empty());  // exactly at the bound
  // Reading is no use: "a" stays the least recently appended to.
  ASSERT_TRUE(s.GetHistory("a").ok());
  ASSERT_TRUE(s.GetAgent("a").ok());
  ASSERT_TRUE(s.AppendTurn("b", "[]", "").ok());
  EXPECT_EQ(dropped, std::vector<std::string>{"a"});
  EXPECT_EQ(s.GetAgent("a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.GetHistory("a").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.bytes(), OneTurnAgent("b") + MemoryHistoryStore::TurnBytes("[]"));
  // A new agent makes "b" (appended to before it) go whole.
  ASSERT_TRUE(s.AppendTurn("c", "[]", "").ok());
  EXPECT_EQ(dropped, (std::vector<std::string>{"a", "b"}));
  auto all = s.ListAgents();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].id, "c");
  EXPECT_EQ(s.bytes(), OneTurnAgent("c"));
}

TEST(MemoryHistoryStoreTest, AppendingMakesAnAgentTheMostRecent) {
  std::vector<std::string> dropped;
  MemoryHistoryStore s(OneTurnAgent("a") + OneTurnAgent("b") + OneTurnAgent("c"),
                       [&](const std::string& id) { dropped.push_back(id); });
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(s.AppendTurn(id, "[]", "").ok());
  ASSERT_TRUE(s.AppendTurn("a", "[]", "").ok());  // over by one turn: "b" goes
  EXPECT_EQ(dropped, std::vector<std::string>{"b"});
  EXPECT_TRUE(s.GetAgent("a").ok());
  EXPECT_TRUE(s.GetAgent("c").ok());
}

TEST(MemoryHistoryStoreTest, TheAgentBeingAppendedToIsNeverDropped) {
  std::vector<std::string> dropped;
  MemoryHistoryStore s(1, [&](const std::string& id) { dropped.push_back(id); });
  const std::string big = "[\"" + std::string(4096, 'x') + "\"]";
  ASSERT_TRUE(s.AppendTurn("a", big, "").ok());
  ASSERT_TRUE(s.AppendTurn("a", big, "").ok());
  EXPECT_TRUE(dropped.empty());  // alone over the bound, and kept
  EXPECT_EQ(s.GetHistory("a")->size(), 2u);
  ASSERT_TRUE(s.AppendTurn("b", "[]", "").ok());
  EXPECT_EQ(dropped, std::vector<std::string>{"a"});
  EXPECT_EQ(s.GetHistory("b")->size(), 1u);
}

TEST(MemoryHistoryStoreTest, RemovalFreesItsBytesAndIsNoDrop) {
  std::vector<std::string> dropped;
  MemoryHistoryStore s(1 << 20, [&](const std::string& id) { dropped.push_back(id); });
  ASSERT_TRUE(s.AppendTurn("a", R"(["x"])", "h").ok());
  ASSERT_TRUE(s.AppendTurn("b", "[]", "").ok());
  ASSERT_TRUE(s.RemoveAgent("a").ok());
  EXPECT_EQ(s.bytes(), OneTurnAgent("b"));
  EXPECT_TRUE(dropped.empty());
  ASSERT_TRUE(s.RemoveAgent("b").ok());
  EXPECT_EQ(s.bytes(), 0u);
}

TEST(MemoryHistoryStoreTest, RejectedTurnsTakeNoRoom) {
  MemoryHistoryStore s(1 << 20);
  EXPECT_FALSE(s.AppendTurn("a", "{not json", "").ok());
  EXPECT_FALSE(s.AppendTurn("", "[]", "").ok());
  EXPECT_EQ(s.bytes(), 0u);
}

TEST(MemoryHistoryStoreTest, KeepsNoKv) {
  MemoryHistoryStore s(1 << 20);
  ASSERT_TRUE(s.AppendTurn("a", "[]", "").ok());
  auto chain = s.GetKvChain("a", *ModelFingerprint::FromHex(std::string(32, 'a')));
  ASSERT_TRUE(chain.ok());
  EXPECT_TRUE(chain->empty());
}

}  // namespace
}  // namespace agentkv::store
