#include "api/api_key.h"

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

TEST(ApiKeyTest, EqualOnlyWhenIdentical) {
  EXPECT_TRUE(KeysEqual("secret", "secret"));
  EXPECT_FALSE(KeysEqual("secreT", "secret"));
  EXPECT_FALSE(KeysEqual("secret ", "secret"));
  EXPECT_FALSE(KeysEqual("sec", "secret"));
  EXPECT_FALSE(KeysEqual("", "secret"));
  EXPECT_TRUE(KeysEqual("", ""));
  // Embedded NULs are bytes like any other.
  EXPECT_FALSE(KeysEqual(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
}

TEST(ApiKeyTest, PresentedKeyFromEitherHeader) {
  EXPECT_EQ(PresentedKey("k1", "Bearer k2"), "k1");
  EXPECT_EQ(PresentedKey("", "Bearer k2"), "k2");
  EXPECT_EQ(PresentedKey("", "bearer k2"), "k2");
  EXPECT_EQ(PresentedKey("", "BEARER k2"), "k2");
  EXPECT_EQ(PresentedKey("", "Basic k2"), "");
  EXPECT_EQ(PresentedKey("", "Bearer "), "");
  EXPECT_EQ(PresentedKey("", ""), "");
}

}  // namespace
}  // namespace agentkv::api
