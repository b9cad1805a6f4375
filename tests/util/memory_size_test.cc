#include "util/memory_size.h"

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(MemorySizeTest, BytesWithSuffixes) {
  EXPECT_EQ(ParseMemorySize("1073741824", "--kv-memory")->bytes, 1073741824u);
  EXPECT_EQ(ParseMemorySize("256M", "--kv-memory")->bytes, 256ull << 20);
  EXPECT_EQ(ParseMemorySize("40G", "--kv-memory")->bytes, 40ull << 30);
  EXPECT_EQ(ParseMemorySize("40GiB", "--kv-memory")->bytes, 40ull << 30);
  EXPECT_EQ(ParseMemorySize("1.5g", "--kv-memory")->bytes, 3ull << 29);
  EXPECT_EQ(ParseMemorySize("512k", "--kv-memory")->bytes, 512ull << 10);
  EXPECT_EQ(ParseMemorySize("2T", "--kv-memory")->bytes, 2ull << 40);
}

TEST(MemorySizeTest, SharesAndZero) {
  Result<MemorySize> f = ParseMemorySize("0.9", "--kv-memory");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->bytes, 0u);
  EXPECT_DOUBLE_EQ(f->fraction, 0.9);
  EXPECT_DOUBLE_EQ(ParseMemorySize("1.0", "--kv-memory")->fraction, 1.0);
  EXPECT_DOUBLE_EQ(ParseMemorySize(".25", "--kv-memory")->fraction, 0.25);
  EXPECT_TRUE(ParseMemorySize("0", "--host-kv-memory")->is_zero);
  // "1" without a point is one byte, not the whole memory.
  EXPECT_EQ(ParseMemorySize("1", "--kv-memory")->bytes, 1u);
}

TEST(MemorySizeTest, BadInputNamesTheFlag) {
  for (const char* bad : {"", "-1", "1.5", "12X", "4Gx", "abc", "nan", "inf", "0.5G5"}) {
    Result<MemorySize> r = ParseMemorySize(bad, "--kv-memory");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--kv-memory"), std::string::npos) << bad;
    }
  }
}

TEST(MemorySizeTest, FormatsBytes) {
  EXPECT_EQ(FormatBytes(100), "100 B");
  EXPECT_EQ(FormatBytes(12 << 10), "12.0 KiB");
  EXPECT_EQ(FormatBytes(64ull << 30), "64.0 GiB");
}

}  // namespace
}  // namespace agentkv
