// Space: the map grows on MDB_MAP_FULL; at the maximum map size or a file
// size limit (standing in for a full disk or quota) writes fail with
// ResourceExhausted and nothing stored is damaged; max_bytes evicts
// least-recently-used KV and never history.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>

#include "store/agent_store.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::Fp;
using testing::MakeChainWrite;
using testing::TempDir;
using testing::Tokens;

std::string Turn(int i) { return "[\"turn " + std::to_string(i) + std::string(2000, '.') + "\"]"; }

TEST(StoreCapacityTest, MapGrowsWhenFull) {
  TempDir dir;
  StoreOptions o;
  o.sync = false;
  o.initial_map_bytes = 256 << 10;
  auto s = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(s.ok());
  const uint64_t before = (*s)->env().map_size();
  for (int i = 0; i < 400; ++i) ASSERT_TRUE((*s)->AppendTurn("a", Turn(i)).ok()) << i;
  for (int i = 0; i < 20; ++i) {
    (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), Tokens(64, i * 1000), 16, 32768, 0, i));
  }
  ASSERT_TRUE((*s)->Flush().ok());
  EXPECT_GE((*s)->env().map_size(), 4 * before);
  EXPECT_EQ((*s)->GetHistory("a")->size(), 400u);
  EXPECT_TRUE((*s)->Verify()->ok());
}

TEST(StoreCapacityTest, MaxMapSizeGivesResourceExhaustedAndKeepsData) {
  TempDir dir;
  StoreOptions o;
  o.sync = false;
  o.initial_map_bytes = 256 << 10;
  o.max_map_bytes = 1 << 20;
  auto s = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(s.ok());
  // Fill with KV until the writer reports the map full.
  Status kv_error;
  for (int i = 0; i < 100 && kv_error.ok(); ++i) {
    (*s)->PutKvBlocks(MakeChainWrite("a", Fp('1'), Tokens(32, i * 1000), 16, 32768, 0, i));
    kv_error = (*s)->Flush();
  }
  ASSERT_EQ(kv_error.code(), StatusCode::kResourceExhausted) << kv_error.ToString();
  EXPECT_NE(kv_error.message().find("maximum map size"), std::string::npos) << kv_error.message();
  // History still gets in: KV is evicted to make room for it.
  int acked = 0;
  Status turn_error;
  for (; acked < 2000; ++acked) {
    auto t = (*s)->AppendTurn("a", Turn(acked));
    if (!t.ok()) {
      turn_error = t.status();
      break;
    }
  }
  EXPECT_GT(acked, 20);  // turns go in after KV filled the map
  EXPECT_GT((*s)->kv_stats().blocks_evicted, 0u);
  ASSERT_EQ(turn_error.code(), StatusCode::kResourceExhausted) << turn_error.ToString();
  EXPECT_EQ((*s)->env().map_size(), 1u << 20);
  auto h = (*s)->GetHistory("a");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->size(), static_cast<size_t>(acked));
  for (int i = 0; i < acked; ++i) ASSERT_EQ((*h)[i].messages_json, Turn(i));
  EXPECT_TRUE((*s)->Verify()->ok());
  s->reset();
  // And after a reopen.
  auto again = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->GetHistory("a")->size(), static_cast<size_t>(acked));
  EXPECT_TRUE((*again)->Verify()->ok());
}

TEST(StoreCapacityTest, FileSizeLimitGivesResourceExhausted) {
  // RLIMIT_FSIZE makes write() fail with EFBIG, as a full disk (ENOSPC) or
  // quota (EDQUOT) would; the child process reports what it acknowledged.
  TempDir dir;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{512 << 10, 512 << 10};
    setrlimit(RLIMIT_FSIZE, &lim);
    StoreOptions o;
    o.worker_threads = 1;
    auto s = AgentStore::Open(dir.path(), o);
    if (!s.ok()) _exit(2);
    for (int i = 0; i < 100000; ++i) {
      auto t = (*s)->AppendTurn("a", Turn(i));
      if (!t.ok()) {
        _exit(t.status().code() == StatusCode::kResourceExhausted ? 0 : 3);
      }
      if (write(fds[1], &i, sizeof i) != sizeof i) _exit(4);
    }
    _exit(5);
  }
  close(fds[1]);
  int n = 0, i;
  while (read(fds[0], &i, sizeof i) == sizeof i) n = i + 1;
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child did not see ResourceExhausted";
  EXPECT_GT(n, 50);
  StoreOptions o;
  o.sync = false;
  auto s = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(s.ok());
  auto h = (*s)->GetHistory("a");
  ASSERT_TRUE(h.ok());
  ASSERT_GE(h->size(), static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) ASSERT_EQ((*h)[k].messages_json, Turn(k));
  EXPECT_TRUE((*s)->Verify()->ok());
}

TEST(StoreCapacityTest, MaxBytesEvictsLeastRecentlyUsedKvNeverHistory) {
  TempDir dir;
  auto clock = std::make_shared<std::atomic<int64_t>>(1000);
  StoreOptions o;
  o.sync = false;
  o.max_bytes = 2 << 20;
  o.clock = [clock] { return clock->fetch_add(1); };
  auto s = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(s.ok());
  auto prefix = [&](int agent) {
    return (*s)->LoadKvPrefixForTokens(Fp('1'), Tokens(64, agent * 1000), 16)->blocks.size();
  };
  for (int a = 0; a < 40; ++a) {
    const std::string id = "agent" + std::to_string(a);
    ASSERT_TRUE((*s)->AppendTurn(id, Turn(a)).ok());
    (*s)->PutKvBlocks(MakeChainWrite(id, Fp('1'), Tokens(64, a * 1000), 16, 65536, 0, a));
    ASSERT_TRUE((*s)->Flush().ok());
    // Agent 0 stays in use: read (touched) after every write.
    if (a > 0) {
      ASSERT_EQ(prefix(0), 4u) << a;
    }
    ASSERT_TRUE((*s)->Flush().ok());
    ASSERT_LE(*(*s)->UsedBytes(), o.max_bytes) << a;
  }
  EXPECT_GT((*s)->kv_stats().blocks_evicted, 0u);
  EXPECT_EQ(prefix(0), 4u);   // recently used: kept
  EXPECT_EQ(prefix(1), 0u);   // least recently used: gone
  EXPECT_EQ(prefix(39), 4u);  // newest: kept
  for (int a = 0; a < 40; ++a) {
    auto h = (*s)->GetHistory("agent" + std::to_string(a));
    ASSERT_TRUE(h.ok());
    ASSERT_EQ(h->size(), 1u);
    // The chain stays; only the blocks it names are gone.
    ASSERT_EQ((*s)->GetKvChain("agent" + std::to_string(a), Fp('1'))->size(), 4u);
  }
  EXPECT_TRUE((*s)->Verify()->ok());
  // rm of an agent whose blocks were evicted still works.
  EXPECT_TRUE((*s)->RemoveAgent("agent1").ok());
}

}  // namespace
}  // namespace agentkv::store
