// TaskPool: tasks run off the poster's thread, all of them by Stop(); a
// throwing task does not take a worker down; tasks posted after Stop() run
// inline.
#include "util/task_pool.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(TaskPoolTest, RunsTasksOnItsWorkersAndAllOfThemBeforeStopReturns) {
  TaskPool pool(2, "test");
  EXPECT_EQ(pool.threads(), 2);
  const auto me = std::this_thread::get_id();
  std::atomic<int> ran{0}, on_me{0}, on_worker{0};
  for (int i = 0; i < 100; ++i) {
    pool.Post([&] {
      if (std::this_thread::get_id() == me) ++on_me;
      if (pool.OnWorker()) ++on_worker;
      ++ran;
    });
  }
  pool.Stop();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(on_me.load(), 0);
  EXPECT_EQ(on_worker.load(), 100);
  EXPECT_FALSE(pool.OnWorker());
  EXPECT_EQ(pool.pending(), 0u);
  // After Stop: inline.
  bool inline_ran = false;
  pool.Post([&] { inline_ran = std::this_thread::get_id() == me; });
  EXPECT_TRUE(inline_ran);
}

TEST(TaskPoolTest, AThrowingTaskDoesNotStopTheWorker) {
  TaskPool pool(1, "test");
  std::atomic<int> ran{0};
  pool.Post([] { throw std::runtime_error("task bug"); });
  pool.Post([&] { ++ran; });
  pool.Post([] { throw 7; });
  pool.Post([&] { ++ran; });
  pool.Stop();
  EXPECT_EQ(ran.load(), 2);
}

TEST(TaskPoolTest, ABlockedTaskDoesNotHoldBackTheOthers) {
  TaskPool pool(2, "test");
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  pool.Post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  for (int i = 0; i < 10; ++i) pool.Post([&] { ++ran; });
  // The second worker runs them while the first is blocked.
  for (int i = 0; i < 10000 && ran.load() < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ran.load(), 10);
  EXPECT_EQ(pool.pending(), 1u);
  release = true;
  pool.Stop();
}

}  // namespace
}  // namespace agentkv
