// AgentStrands: one agent's tasks start in order and never overlap, even
// when they complete asynchronously on other threads; different agents run
// at the same time; synchronous completion is iterative.
#include "agent/agent_strands.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "util/task_pool.h"

namespace agentkv::agent {
namespace {

TEST(AgentStrandsTest, OneAgentRunsInArrivalOrderWithoutOverlap) {
  AgentStrands strands;
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> running{0}, max_running{0};
  std::vector<std::thread> finishers;
  constexpr int kTasks = 50;
  for (int i = 0; i < kTasks; ++i) {
    strands.Post("a", [&, i] {
      const int r = ++running;
      int m = max_running.load();
      while (r > m && !max_running.compare_exchange_weak(m, r)) {
      }
      // Completes later, on another thread (an engine request finishing).
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      finishers.emplace_back([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        --running;
        strands.Done("a");
      });
    });
  }
  for (int spins = 0; spins < 2000; ++spins) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (static_cast<int>(order.size()) == kTasks) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu);
    threads.swap(finishers);
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(order.size(), static_cast<size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(max_running.load(), 1);
  EXPECT_EQ(strands.Pending("a"), 0u);
  EXPECT_EQ(strands.BusyAgents(), 0u);
}

TEST(AgentStrandsTest, DifferentAgentsRunConcurrently) {
  AgentStrands strands;
  bool a_started = false, b_started = false, a2_started = false;
  strands.Post("a", [&] { a_started = true; });  // holds "a" until Done
  strands.Post("a", [&] { a2_started = true; });
  strands.Post("b", [&] { b_started = true; });  // not blocked by "a"
  EXPECT_TRUE(a_started);
  EXPECT_TRUE(b_started);
  EXPECT_FALSE(a2_started);
  EXPECT_EQ(strands.Pending("a"), 2u);
  EXPECT_EQ(strands.BusyAgents(), 2u);
  strands.Done("a");
  EXPECT_TRUE(a2_started);
  strands.Done("a");
  strands.Done("b");
  EXPECT_EQ(strands.BusyAgents(), 0u);
  strands.Done("b");  // extra Done: ignored
  EXPECT_EQ(strands.Pending("b"), 0u);
}

TEST(AgentStrandsTest, SynchronousDoneIsIterative) {
  AgentStrands strands;
  int ran = 0;
  strands.Post("a", [] {});       // held: the rest queue behind it
  constexpr int kTasks = 200000;  // deep enough to overflow a recursive design
  for (int i = 0; i < kTasks; ++i) {
    strands.Post("a", [&] {
      ++ran;
      strands.Done("a");  // completes inside the task
    });
  }
  EXPECT_EQ(ran, 0);
  strands.Done("a");
  EXPECT_EQ(ran, kTasks);
  EXPECT_EQ(strands.Pending("a"), 0u);
}

TEST(AgentStrandsTest, ThrowingTaskCountsAsDoneAndTheStrandGoesOn) {
  AgentStrands strands;
  // Waits behind a running task; the running one then throws on Done's
  // thread.
  bool first_ran = false, second_ran = false, third_ran = false;
  strands.Post("a", [&] { first_ran = true; });  // asynchronous: Done comes later
  strands.Post("a", [&] {
    second_ran = true;
    throw std::runtime_error("task failed");
  });
  strands.Post("a", [&] {
    third_ran = true;
    strands.Done("a");
  });
  EXPECT_TRUE(first_ran);
  EXPECT_FALSE(second_ran);
  EXPECT_THROW(strands.Done("a"), std::runtime_error);
  EXPECT_TRUE(second_ran);
  EXPECT_TRUE(third_ran);  // the strand is not wedged behind the failure
  EXPECT_EQ(strands.Pending("a"), 0u);
  EXPECT_EQ(strands.BusyAgents(), 0u);
  // A throwing task posted to an idle agent: the poster sees the exception
  // and the agent takes new tasks.
  EXPECT_THROW(strands.Post("b", [] { throw std::runtime_error("x"); }), std::runtime_error);
  bool later = false;
  strands.Post("b", [&] {
    later = true;
    strands.Done("b");
  });
  EXPECT_TRUE(later);
  EXPECT_EQ(strands.Pending("b"), 0u);
}

TEST(AgentStrandsTest, WithAnExecutorTasksNeverRunOnThePostersThread) {
  TaskPool pool(2, "strands");
  AgentStrands strands([&pool](std::function<void()> f) { pool.Post(std::move(f)); });
  const auto me = std::this_thread::get_id();
  std::atomic<int> on_me{0}, ran{0};
  for (int i = 0; i < 20; ++i) {
    strands.Post("a", [&] {
      if (std::this_thread::get_id() == me) ++on_me;
      ++ran;
      strands.Done("a");  // synchronous: the next starts after this returns
    });
  }
  // An asynchronous task: its Done, called here, starts the next on the pool.
  std::atomic<bool> started{false};
  strands.Post("b", [&] { started = true; });
  strands.Post("b", [&] {
    if (std::this_thread::get_id() == me) ++on_me;
    ++ran;
    strands.Done("b");
  });
  for (int i = 0; i < 10000 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(started);
  strands.Done("b");
  for (int i = 0; i < 10000 && ran.load() < 21; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  pool.Stop();
  EXPECT_EQ(ran.load(), 21);
  EXPECT_EQ(on_me.load(), 0);
  EXPECT_EQ(strands.Pending("a") + strands.Pending("b"), 0u);
}

}  // namespace
}  // namespace agentkv::agent
