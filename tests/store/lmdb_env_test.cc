// LmdbEnv's write priorities: a background write (KV write-behind) that
// arrives while a foreground write (a history commit) waits for the writer
// lock goes after it.
#include "store/lmdb_env.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::TempDir;

TEST(LmdbEnvTest, BackgroundWritesGiveWayToWaitingForegroundWrites) {
  TempDir dir;
  LmdbOptions o;
  o.sync = false;
  auto env = LmdbEnv::Open(dir.path(), o);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  std::mutex mu;
  std::vector<std::string> order;
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(what);
  };
  // B1 holds the writer lock until released; F then waits for it; B2
  // arrives after F and must not overtake it.
  std::atomic<bool> release{false}, b1_in{false};
  std::thread b1([&] {
    Status s = (*env)->WriteBackground([&](LmdbEnv::WriteTxn& t) {
      b1_in = true;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      note("b1");
      return t.Put(Db::kModels, "b1", "x");
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  while (!b1_in) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread f([&] {
    Status s = (*env)->Write([&](LmdbEnv::WriteTxn& t) {
      note("f");
      return t.Put(Db::kModels, "f", "x");
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  // (Waits on the writer counts, not on time: a loaded machine can keep a
  // thread from starting for longer than any sleep.)
  while ((*env)->foreground_writers() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread b2([&] {
    Status s = (*env)->WriteBackground([&](LmdbEnv::WriteTxn& t) {
      note("b2");
      return t.Put(Db::kModels, "b2", "x");
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  while ((*env)->background_yields() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  release = true;
  b1.join();
  f.join();
  b2.join();
  EXPECT_EQ(order, (std::vector<std::string>{"b1", "f", "b2"}));
  EXPECT_EQ((*env)->background_yields(), 1u);
  // With no foreground writer around, a background write does not wait.
  ASSERT_TRUE(
      (*env)
          ->WriteBackground([](LmdbEnv::WriteTxn& t) { return t.Put(Db::kModels, "b3", "x"); })
          .ok());
  EXPECT_EQ((*env)->background_yields(), 1u);
}

}  // namespace
}  // namespace agentkv::store
