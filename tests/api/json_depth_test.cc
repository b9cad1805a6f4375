#include "api/json_depth.h"

#include <string>

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

std::string Nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) +
         std::string(static_cast<size_t>(depth), close);
}

TEST(JsonDepthTest, CountsArraysAndObjects) {
  EXPECT_EQ(JsonNestingDepth("1", 64), 0);
  EXPECT_EQ(JsonNestingDepth("\"x\"", 64), 0);
  EXPECT_EQ(JsonNestingDepth("[]", 64), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a":[1,{"b":[]}],"c":{}})", 64), 4);
  EXPECT_EQ(JsonNestingDepth(Nested(64), 64), 64);
}

TEST(JsonDepthTest, BracketsInsideStringsDoNotCount) {
  EXPECT_EQ(JsonNestingDepth(R"({"a":"[[[[{{{{"})", 64), 1);
  // An escaped quote does not end the string; an escaped backslash does not
  // escape the quote after it.
  EXPECT_EQ(JsonNestingDepth(R"({"a":"\"[[[["})", 64), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a":"\\",  "b":[[1]]})", 64), 3);
}

TEST(JsonDepthTest, StopsEarlyPastTheLimit) {
  const std::string deep = Nested(100000, '{', '}');
  EXPECT_EQ(JsonNestingDepth(deep, 64), 65);
  EXPECT_EQ(JsonNestingDepth(Nested(65), 64), 65);
}

TEST(JsonDepthTest, MalformedTextIsScannedWithoutFailing) {
  EXPECT_EQ(JsonNestingDepth("]]]][[", 64), 2);
  EXPECT_EQ(JsonNestingDepth("{\"unterminated [[[[", 64), 1);
}

}  // namespace
}  // namespace agentkv::api
