// The write-behind queue's bound, without a writer thread racing it: pushes
// past the bound drop the oldest pending writes, never the newest, and count
// them.
#include "store/kv_write_queue.h"

#include <gtest/gtest.h>

namespace agentkv::store {
namespace {

KvChainWrite Write(int i, size_t bytes) {
  KvChainWrite w;
  w.agent_id = "a" + std::to_string(i);
  w.first_index = static_cast<uint32_t>(i);
  KvBlockWrite b;
  b.tokens = {i};
  b.data = std::string(bytes, static_cast<char>(i));
  w.blocks.push_back(std::move(b));
  return w;
}

TEST(KvWriteQueueTest, OverBoundDropsOldestAndCounts) {
  KvWriteQueue q(64 << 10);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(q.Push(Write(i, 30 << 10)));
  const KvWriteQueue::Stats st = q.stats();
  EXPECT_GT(st.dropped_writes, 0u);
  EXPECT_LE(st.pending_bytes, 64u << 10);
  EXPECT_EQ(st.pending_writes + st.dropped_writes, 100u);
  std::vector<KvChainWrite> out;
  ASSERT_TRUE(q.PopBatch(1 << 30, &out));
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back().agent_id, "a99");  // the newest survives
  for (size_t i = 1; i < out.size(); ++i)
    EXPECT_LT(out[i - 1].first_index, out[i].first_index);  // in order
  q.MarkDone();
  q.Close();
  EXPECT_FALSE(q.Push(Write(100, 10)));
}

TEST(KvWriteQueueTest, OverBoundNeverDropsARemoval) {
  KvWriteQueue q(64 << 10);
  ASSERT_TRUE(q.Push(Write(0, 30 << 10)));
  KvChainWrite removal;
  removal.agent_id = "a0";
  removal.discard_unrecorded = true;
  ASSERT_TRUE(q.Push(std::move(removal)));
  // Pushes past the bound drop the writes around the removal, not it: the
  // writes it follows may be written already.
  for (int i = 1; i < 10; ++i) ASSERT_TRUE(q.Push(Write(i, 30 << 10)));
  EXPECT_GT(q.stats().dropped_writes, 0u);
  std::vector<KvChainWrite> out;
  ASSERT_TRUE(q.PopBatch(1 << 30, &out));
  ASSERT_GE(out.size(), 2u);
  EXPECT_TRUE(out.front().discard_unrecorded);
  EXPECT_EQ(out.front().agent_id, "a0");
  EXPECT_EQ(out.back().agent_id, "a9");
}

TEST(KvWriteQueueTest, OversizedWriteIsTakenWhenEmpty) {
  KvWriteQueue q(1 << 10);
  ASSERT_TRUE(q.Push(Write(0, 4 << 10)));
  EXPECT_EQ(q.stats().pending_writes, 1u);
  EXPECT_EQ(q.stats().dropped_writes, 0u);
}

}  // namespace
}  // namespace agentkv::store
