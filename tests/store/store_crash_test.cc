// kill -9 at random moments: every acknowledged turn survives and no record
// is corrupt. The child is a fork of this (single-threaded) test process
// that opens its own environment; the parent's store is closed at fork time.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "store/agent_store.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::Fp;
using testing::MakeChainWrite;
using testing::TempDir;
using testing::Tokens;

constexpr int kAgents = 3;

std::string TurnText(int cycle, int k) {
  return "[{\"role\":\"user\",\"content\":\"cycle " + std::to_string(cycle) + " turn " +
         std::to_string(k) + " " + std::string(100 + (k * 37) % 400, 'x') + "\"}]";
}

struct Ack {
  int32_t agent;
  uint32_t turn;
  int32_t k;
};

[[noreturn]] void Child(const std::string& dir, int cycle, int fd) {
  StoreOptions o;
  o.worker_threads = 1;
  auto s = AgentStore::Open(dir, o);
  if (!s.ok()) _exit(2);
  for (int k = 0;; ++k) {
    const int agent = k % kAgents;
    const std::string id = "agent" + std::to_string(agent);
    auto turn = (*s)->AppendTurn(id, TurnText(cycle, k));
    if (!turn.ok()) _exit(3);
    Ack a{agent, *turn, k};
    if (write(fd, &a, sizeof a) != static_cast<ssize_t>(sizeof a)) _exit(4);
    // KV written behind, racing the kill too.
    (*s)->PutKvBlocks(MakeChainWrite(id, Fp('c'), Tokens(16 * (2 + k % 4), cycle * 1000 + k), 16,
                                     2048, 0, static_cast<uint32_t>(k)));
  }
}

TEST(StoreCrashTest, KillNineLosesNoAcknowledgedTurn) {
  TempDir dir;
  std::mt19937 rng(12345);
  struct Expected {
    int cycle;
    int k;
  };
  std::map<std::pair<int, uint32_t>, Expected> acked;  // (agent, turn) -> content
  const auto start = std::chrono::steady_clock::now();
  int cycles = 0, total_acks = 0;
  for (int cycle = 0; cycle < 200; ++cycle, ++cycles) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      Child(dir.path(), cycle, fds[1]);
    }
    close(fds[1]);
    // Random moments: during open (no acks awaited), or after a random
    // number of acknowledged turns plus a random delay, which lands between
    // commits, inside a commit or inside a KV group commit.
    Ack a;
    auto take = [&] {
      acked[{a.agent, a.turn}] = Expected{cycle, a.k};
      ++total_acks;
    };
    const int wait_acks = static_cast<int>(rng() % 8);
    for (int i = 0; i < wait_acks && read(fds[0], &a, sizeof a) == sizeof a; ++i) take();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited by itself with " << WEXITSTATUS(status);
    while (read(fds[0], &a, sizeof a) == static_cast<ssize_t>(sizeof a)) take();
    close(fds[0]);

    StoreOptions o;
    o.sync = false;
    o.worker_threads = 1;
    auto s = AgentStore::Open(dir.path(), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int agent = 0; agent < kAgents; ++agent) {
      const std::string id = "agent" + std::to_string(agent);
      auto h = (*s)->GetHistory(id);
      if (h.status().code() == StatusCode::kNotFound) continue;
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      for (size_t i = 0; i < h->size(); ++i) ASSERT_EQ((*h)[i].number, i + 1);
      auto meta = (*s)->GetAgent(id);
      ASSERT_TRUE(meta.ok());
      ASSERT_EQ(meta->turns, h->size());
      for (auto it = acked.lower_bound({agent, 0}); it != acked.end() && it->first.first == agent;
           ++it) {
        ASSERT_LE(it->first.second, h->size()) << "acknowledged turn lost, cycle " << cycle;
        ASSERT_EQ((*h)[it->first.second - 1].messages_json,
                  TurnText(it->second.cycle, it->second.k));
      }
    }
    auto v = (*s)->Verify();
    ASSERT_TRUE(v.ok());
    ASSERT_TRUE(v->ok()) << v->problems.front();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d kill -9 cycles, %d acknowledged turns, %.1f s\n", cycles, total_acks, secs);
  EXPECT_EQ(cycles, 200);
  EXPECT_GT(total_acks, 200);
}

}  // namespace
}  // namespace agentkv::store
