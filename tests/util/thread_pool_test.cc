#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace agentkv {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      for (int64_t grain : {1, 3, 64}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad_thread{0};
        pool.ParallelFor(n, grain, [&](int64_t i, int t) {
          hits[i].fetch_add(1);
          if (t < 0 || t >= threads) bad_thread = 1;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
        EXPECT_EQ(bad_thread.load(), 0);
      }
    }
  }
}

TEST(ThreadPoolTest, ManyLoopsInARowSeeAllWorkDone) {
  ThreadPool pool(3);
  std::vector<int64_t> v(257, 0);
  for (int round = 1; round <= 500; ++round) {
    pool.ParallelFor(static_cast<int64_t>(v.size()), 4, [&](int64_t i, int) { v[i] += i; });
  }
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], 500 * static_cast<int64_t>(i));
}

}  // namespace
}  // namespace agentkv
