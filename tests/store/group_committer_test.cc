#include "store/group_committer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "store/agent_store.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::TempDir;

std::unique_ptr<LmdbEnv> OpenEnv(const TempDir& dir) {
  LmdbOptions o;
  o.sync = false;
  auto env = LmdbEnv::Open(dir.path(), o);
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return std::move(env).value();
}

std::string Read(LmdbEnv& env, const std::string& key) {
  auto r = env.BeginRead();
  EXPECT_TRUE(r.ok());
  auto v = r->Get(Db::kMeta, key);
  EXPECT_TRUE(v.ok());
  return v.ok() && *v ? std::string(**v) : std::string("<absent>");
}

// Runs n requests from n threads: request 0 blocks inside its transaction
// until all n are queued, so requests 1..n-1 wait together for the next
// leader. Request i applies apply(i, txn). Returns each request's result.
std::vector<Status> CommitTogether(GroupCommitter& gc, int n,
                                   const std::function<Status(int, LmdbEnv::WriteTxn&)>& apply) {
  std::atomic<bool> first_entered{false};
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    results[0] = gc.Commit([&](LmdbEnv::WriteTxn& t) -> Status {
      first_entered = true;
      while (gc.busy() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return apply(0, t);
    });
  });
  while (!first_entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 1; i < n; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = gc.Commit([&](LmdbEnv::WriteTxn& t) { return apply(i, t); }); });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(GroupCommitterTest, WaitingRequestsShareOneTransaction) {
  TempDir dir;
  auto env = OpenEnv(dir);
  GroupCommitter gc(env.get());
  constexpr int kThreads = 16;
  const std::vector<Status> results = CommitTogether(gc, kThreads, [](int i, LmdbEnv::WriteTxn& t) {
    return t.Put(Db::kMeta, "k" + std::to_string(i), "v" + std::to_string(i));
  });
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].ToString();
    EXPECT_EQ(Read(*env, "k" + std::to_string(i)), "v" + std::to_string(i));
  }
  const GroupCommitter::Stats s = gc.stats();
  EXPECT_EQ(s.requests, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(s.transactions, 2u);  // the blocked leader's, then everyone else's
  EXPECT_EQ(gc.busy(), 0);
  EXPECT_GE(s.max_wait_seconds, 0.0);
}

// A request that fails takes only itself down: its group is retried one
// request per transaction.
TEST(GroupCommitterTest, OneFailingRequestFailsOnlyItself) {
  TempDir dir;
  auto env = OpenEnv(dir);
  GroupCommitter gc(env.get());
  constexpr int kThreads = 8;
  std::atomic<int> bad_runs{0};
  const std::vector<Status> results =
      CommitTogether(gc, kThreads, [&](int i, LmdbEnv::WriteTxn& t) -> Status {
        RETURN_IF_ERROR(t.Put(Db::kMeta, "k" + std::to_string(i), "v"));
        if (i == 3) {
          ++bad_runs;
          return InvalidArgument("request 3 is bad");
        }
        return Status::Ok();
      });
  for (int i = 0; i < kThreads; ++i) {
    if (i == 3) {
      EXPECT_EQ(results[i].code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(Read(*env, "k3"), "<absent>");  // its put was rolled back
    } else {
      EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].ToString();
      EXPECT_NE(Read(*env, "k" + std::to_string(i)), "<absent>");
    }
  }
  EXPECT_EQ(bad_runs.load(), 2);  // in the group, then alone
}

// Through AgentStore: concurrent turns of many agents are all durable with
// the right numbers, in fewer transactions than turns when they overlap.
TEST(GroupCommitterTest, AgentStoreConcurrentAppends) {
  TempDir dir;
  StoreOptions o;
  o.sync = false;
  o.worker_threads = 2;
  auto st = AgentStore::Open(dir.path(), o);
  ASSERT_TRUE(st.ok());
  constexpr int kAgents = 32, kTurns = 5;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int a = 0; a < kAgents; ++a) {
    threads.emplace_back([&, a] {
      const std::string id = "agent-" + std::to_string(a);
      for (int t = 1; t <= kTurns; ++t) {
        auto n = (*st)->AppendTurn(id, "[" + std::to_string(t) + "]");
        if (!n.ok() || *n != static_cast<uint32_t>(t)) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int a = 0; a < kAgents; ++a) {
    auto h = (*st)->GetHistory("agent-" + std::to_string(a));
    ASSERT_TRUE(h.ok());
    ASSERT_EQ(h->size(), static_cast<size_t>(kTurns));
    for (int t = 0; t < kTurns; ++t)
      EXPECT_EQ((*h)[t].messages_json, "[" + std::to_string(t + 1) + "]");
  }
  const auto s = (*st)->history_stats();
  EXPECT_EQ(s.requests, static_cast<uint64_t>(kAgents * kTurns));
  EXPECT_LE(s.transactions, s.requests);
}

}  // namespace
}  // namespace agentkv::store
