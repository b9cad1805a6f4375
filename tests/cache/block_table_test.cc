#include "cache/block_table.h"

#include <gtest/gtest.h>

namespace agentkv::cache {
namespace {

TEST(BlockTableTest, LinearMapsPositionsToSlots) {
  BlockTable t(4, 0);
  EXPECT_FALSE(t.is_ring());
  t.Append(7);
  t.Append(3);
  EXPECT_EQ(t.BlockAt(0), 7);
  EXPECT_EQ(t.BlockAt(3), 7);
  EXPECT_EQ(t.BlockAt(4), 3);
  EXPECT_EQ(t.BlockAt(8), -1);
  EXPECT_EQ(t.SlotOf(5), 5);
}

TEST(BlockTableTest, RingWrapsLogicalBlocks) {
  BlockTable t(4, 3);
  EXPECT_TRUE(t.is_ring());
  for (int32_t b : {10, 11, 12}) t.Append(b);
  EXPECT_EQ(t.SlotOf(3), 0);
  EXPECT_EQ(t.SlotOf(7), 1);
  EXPECT_EQ(t.BlockAt(12), 10);  // logical block 3 -> slot 0
  EXPECT_EQ(t.BlockAt(21), 12);  // logical block 5 -> slot 2
  t.Set(1, 20);
  EXPECT_EQ(t.BlockAt(16), 20);
}

}  // namespace
}  // namespace agentkv::cache
