#include "util/hash.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace agentkv {
namespace {

// Runs the xxhash package's `xxhsum` (an independent build of the reference
// implementation) on `data`; empty if the tool is not installed.
std::string XxhsumOutput(const std::string& algo_flag, const std::string& data) {
  if (std::system("command -v xxhsum >/dev/null 2>&1") != 0) return "";
  auto path =
      std::filesystem::temp_directory_path() / ("agentkv_hash_test_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary);
    out << data;
  }
  std::string cmd = "xxhsum " + algo_flag + " '" + path.string() + "' 2>/dev/null";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) text.append(buf, n);
    pclose(p);
  }
  std::filesystem::remove(path);
  return text;
}

std::vector<std::string> Inputs() {
  std::vector<std::string> in = {"", "a", "abc", "The quick brown fox jumps over the lazy dog"};
  // Lengths around XXH3's internal block boundaries (16, 128, 240, 1024+).
  std::mt19937 gen(7);  // only to make bytes; the expected hashes come from xxhsum
  for (size_t len : {16u, 17u, 128u, 129u, 240u, 241u, 1024u, 4096u, 100000u}) {
    std::string s(len, '\0');
    for (auto& c : s) c = static_cast<char>(gen());
    in.push_back(s);
  }
  return in;
}

TEST(HashTest, Xxh3_128MatchesXxhsum) {
  if (XxhsumOutput("-H2", "x").empty()) GTEST_SKIP() << "xxhsum not installed";
  for (const auto& s : Inputs()) {
    std::string out = XxhsumOutput("-H2", s);
    // "<32 hex>  <file>"
    ASSERT_GE(out.size(), 32u);
    EXPECT_EQ(Xxh3_128(s).Hex(), out.substr(0, 32)) << "length " << s.size();
  }
}

TEST(HashTest, Xxh3_64MatchesXxhsum) {
  if (XxhsumOutput("-H3", "x").empty()) GTEST_SKIP() << "xxhsum not installed";
  for (const auto& s : Inputs()) {
    std::string out = XxhsumOutput("-H3", s);
    // "XXH3 (<file>) = <16 hex>"
    auto eq = out.rfind("= ");
    ASSERT_NE(eq, std::string::npos) << out;
    EXPECT_EQ(Hex64(Xxh3_64(s)), out.substr(eq + 2, 16)) << "length " << s.size();
  }
}

TEST(HashTest, StreamingEqualsOneShot) {
  for (const auto& s : Inputs()) {
    Xxh3Hasher128 h;
    // Uneven pieces, to cross internal buffer boundaries.
    size_t pos = 0, step = 1;
    while (pos < s.size()) {
      size_t n = std::min(step, s.size() - pos);
      h.Update(s.data() + pos, n);
      pos += n;
      step = step * 3 + 1;
    }
    EXPECT_EQ(h.Digest(), Xxh3_128(s)) << "length " << s.size();
  }
}

TEST(HashTest, SeedAndUpdateU64ChangeTheHash) {
  EXPECT_NE(Xxh3_128("abc", 0), Xxh3_128("abc", 1));
  EXPECT_NE(Xxh3_64("abc", 0), Xxh3_64("abc", 1));
  Xxh3Hasher128 a, b;
  a.UpdateU64(1);
  b.UpdateU64(2);
  EXPECT_NE(a.Digest(), b.Digest());
  // UpdateU64 is little-endian bytes.
  Xxh3Hasher128 c;
  c.UpdateU64(0x0807060504030201ull);
  EXPECT_EQ(c.Digest(), Xxh3_128(std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8)));
}

TEST(HashTest, HexFormat) {
  Hash128 h{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(h.Hex(), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(Hex64(0xabc), "0000000000000abc");
}

}  // namespace
}  // namespace agentkv
