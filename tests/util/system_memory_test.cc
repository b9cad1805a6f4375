#include "util/system_memory.h"

#include <gtest/gtest.h>

namespace agentkv {
namespace {

TEST(SystemMemoryTest, ParsesMemAvailable) {
  const char* text =
      "MemTotal:       24576000 kB\n"
      "MemFree:         1000000 kB\n"
      "MemAvailable:   20000000 kB\n"
      "Buffers:          100000 kB\n";
  Result<uint64_t> got = ParseMemAvailable(text);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 20000000ull * 1024);
}

TEST(SystemMemoryTest, MissingOrBadLineIsAnError) {
  EXPECT_EQ(ParseMemAvailable("MemTotal: 1 kB\n").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: lots\n").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 12 MB\n").status().code(),
            StatusCode::kInvalidArgument);
  // A longer key that merely starts alike is not the line.
  EXPECT_EQ(ParseMemAvailable("MemAvailableX: 12 kB\n").status().code(), StatusCode::kNotFound);
}

TEST(SystemMemoryTest, ThisMachineHasSome) {
  Result<uint64_t> got = AvailableHostMemoryBytes();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_GT(*got, 0u);
}

}  // namespace
}  // namespace agentkv
