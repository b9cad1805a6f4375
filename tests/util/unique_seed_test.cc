#include "util/unique_seed.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

namespace agentkv {
namespace {

// Distinct across calls on several threads, and not a plain counter (tool
// call ids derived from consecutive seeds must not share digits).
TEST(UniqueSeedTest, DistinctAcrossThreadsAndNotSequential) {
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&got, t] {
      for (int i = 0; i < kEach; ++i) got[t].push_back(UniqueSeed());
    });
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (const auto& v : got) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
  const uint64_t a = UniqueSeed(), b = UniqueSeed();
  EXPECT_NE(b - a, 1u);
  EXPECT_GT(__builtin_popcountll(a ^ b), 8);
}

}  // namespace
}  // namespace agentkv
