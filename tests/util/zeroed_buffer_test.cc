#include "util/zeroed_buffer.h"

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(ZeroedBufferTest, IsZeroedWritableAndMovable) {
  Result<ZeroedBuffer> b = ZeroedBuffer::Allocate(3 << 20);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->size(), size_t{3} << 20);
  for (size_t i = 0; i < b->size(); i += 4093) EXPECT_EQ(b->data()[i], std::byte{0});
  b->as<float>()[7] = 1.5f;
  ZeroedBuffer moved = std::move(b).value();
  EXPECT_EQ(moved.as<float>()[7], 1.5f);
  ZeroedBuffer other;
  other = std::move(moved);
  EXPECT_EQ(other.as<float>()[7], 1.5f);
  EXPECT_EQ(moved.data(), nullptr);  // NOLINT: moved-from is empty by contract
}

TEST(ZeroedBufferTest, EmptyAndRefused) {
  Result<ZeroedBuffer> empty = ZeroedBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  // More address space than x86-64 user space has.
  Result<ZeroedBuffer> huge = ZeroedBuffer::Allocate(size_t{1} << 62);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
}

TEST(ZeroedBufferTest, LargeBuffersCostNothingUntilTouched) {
  // 8 GiB of address space: instant, and only the touched page is memory.
  Result<ZeroedBuffer> big = ZeroedBuffer::Allocate(size_t{8} << 30);
  if (!big.ok()) GTEST_SKIP() << "overcommit refused: " << big.status().ToString();
  big->data()[(size_t{8} << 30) - 1] = std::byte{1};
  EXPECT_EQ(big->data()[(size_t{8} << 30) - 1], std::byte{1});
}

}  // namespace
}  // namespace agentkv
