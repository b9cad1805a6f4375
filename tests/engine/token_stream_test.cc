#include "engine/token_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace agentkv::engine {
namespace {

RequestOutput Delta(const std::string& text) {
  RequestOutput e;
  e.kind = RequestOutput::Kind::kDelta;
  e.text = text;
  return e;
}

TEST(TokenStreamTest, NotifiesOnlyWhenTheQueueWasEmpty) {
  TokenStream s;
  int wakes = 0;
  s.SetNotifier([&] { ++wakes; });
  s.Push(Delta("a"));
  EXPECT_EQ(wakes, 1);
  s.Push(Delta("b"));  // the consumer has not drained "a": no second wake
  s.Push(Delta("c"));
  EXPECT_EQ(wakes, 1);
  RequestOutput e;
  std::string got;
  while (s.TryPop(&e)) got += e.text;
  EXPECT_EQ(got, "abc");
  s.Push(Delta("d"));  // drained: the next event wakes again
  EXPECT_EQ(wakes, 2);
}

TEST(TokenStreamTest, RegistrationWakesForQueuedEventsAndClosesAfterTheLast) {
  TokenStream s;
  s.Push(Delta("a"));
  int wakes = 0;
  s.SetNotifier([&] { ++wakes; });
  EXPECT_EQ(wakes, 1);
  RequestOutput fin;
  fin.kind = RequestOutput::Kind::kFinished;
  s.Push(fin);
  EXPECT_TRUE(s.closed());
  s.Push(Delta("late"));  // dropped after the stream closed
  RequestOutput e;
  ASSERT_TRUE(s.TryPop(&e));
  ASSERT_TRUE(s.TryPop(&e));
  EXPECT_EQ(e.kind, RequestOutput::Kind::kFinished);
  EXPECT_FALSE(s.TryPop(&e));
  s.SetNotifier(nullptr);
  EXPECT_EQ(wakes, 1);
}

// A consumer that drains on every wake sees every event, in order, however
// pushes and drains interleave.
TEST(TokenStreamTest, NoEventIsStrandedAcrossThreads) {
  TokenStream s;
  std::atomic<int> pending_wakes{0};
  s.SetNotifier([&] { ++pending_wakes; });
  constexpr int kEvents = 20000;
  std::thread producer([&] {
    for (int i = 0; i < kEvents; ++i) s.Push(Delta(std::to_string(i)));
    RequestOutput fin;
    fin.kind = RequestOutput::Kind::kFinished;
    s.Push(fin);
  });
  int next = 0;
  bool finished = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!finished) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "stranded after event " << next;
      break;
    }
    if (pending_wakes.load() == 0) {
      std::this_thread::yield();
      continue;
    }
    --pending_wakes;
    RequestOutput e;
    while (s.TryPop(&e)) {
      if (e.kind == RequestOutput::Kind::kFinished) {
        finished = true;
        break;
      }
      EXPECT_EQ(e.text, std::to_string(next));
      ++next;
    }
  }
  producer.join();
  EXPECT_EQ(next, kEvents);
}

}  // namespace
}  // namespace agentkv::engine
