#include "engine/text/output/json_stream_scanner.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace agentkv::text::output {
namespace {

bool ScanAll(const std::string& s) {
  JsonStreamScanner sc;
  for (char c : s) {
    if (!sc.Feed(c)) return false;
  }
  return sc.Finish() && sc.done();
}

TEST(JsonStreamScannerTest, AgreesWithNlohmannOnValidity) {
  const std::vector<std::string> cases = {
      "{}", "[]", "0", "-0", "12.5e+3", "1E5", "-1.0e-2", "true", "false", "null",
      R"("a\"b\\c\/\b\f\n\r\t\u00e9")", R"({"a": [1, 2, {"b": null}], "c": "d"})",
      " \n{ \"k\" : [ ] } \t", R"([[[[]]]])", R"({"a":{"b":{"c":[true,false]}}})",
      // invalid
      "", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "-", "1.", "1e", "1e+", ".5",
      "tru", "nul", "truex", "\"abc", "\"\\x\"", "\"\\u12g4\"", "{\"a\":1}}", "[1 2]",
      "{\"a\":1 \"b\":2}", "\"tab\there\"", "[1]x", "+1", "{\"a\"::1}", "[,1]", "{,}"};
  for (const std::string& s : cases) {
    const bool ref = !nlohmann::json::parse(s, nullptr, false).is_discarded();
    EXPECT_EQ(ScanAll(s), ref) << s;
  }
}

TEST(JsonStreamScannerTest, FailsAtTheFirstBadByte) {
  JsonStreamScanner sc;
  const std::string s = R"({"a": [1, 2)";
  for (char c : s) ASSERT_TRUE(sc.Feed(c));
  EXPECT_EQ(sc.depth(), 2);
  EXPECT_FALSE(sc.Feed('<'));
  EXPECT_TRUE(sc.failed());
  EXPECT_FALSE(sc.Feed(']'));  // sticky
}

TEST(JsonStreamScannerTest, MarksLocateMembersOfTheTopObject) {
  const std::string s = R"({"name": "f", "n": 12, "args": {"x": [1, "}"]}, "t": true})";
  JsonStreamScanner sc;
  struct Seen {
    JsonStreamScanner::Event event;
    size_t begin_or_end;
  };
  std::vector<Seen> seen;
  for (size_t i = 0; i < s.size(); ++i) {
    ASSERT_TRUE(sc.Feed(s[i])) << i;
    for (const auto& m : sc.marks()) {
      if (m.depth != 1) continue;
      const bool is_end = m.event == JsonStreamScanner::Event::kValueEnd ||
                          m.event == JsonStreamScanner::Event::kKeyEnd;
      seen.push_back({m.event, is_end ? (m.before_byte ? i : i + 1) : i});
    }
  }
  EXPECT_TRUE(sc.done());
  // Reconstruct the depth-1 values from the marks.
  std::vector<std::string> values, keys;
  size_t vb = 0, kb = 0;
  for (const Seen& x : seen) {
    switch (x.event) {
      case JsonStreamScanner::Event::kKeyBegin:
        kb = x.begin_or_end;
        break;
      case JsonStreamScanner::Event::kKeyEnd:
        keys.push_back(s.substr(kb, x.begin_or_end - kb));
        break;
      case JsonStreamScanner::Event::kValueBegin:
        vb = x.begin_or_end;
        break;
      case JsonStreamScanner::Event::kValueEnd:
        values.push_back(s.substr(vb, x.begin_or_end - vb));
        break;
    }
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"\"name\"", "\"n\"", "\"args\"", "\"t\""}));
  EXPECT_EQ(values, (std::vector<std::string>{"\"f\"", "12", R"({"x": [1, "}"]})", "true"}));
}

TEST(JsonStreamScannerTest, TopLevelNumberEndsAtFinish) {
  JsonStreamScanner sc;
  for (char c : std::string("42")) ASSERT_TRUE(sc.Feed(c));
  EXPECT_FALSE(sc.done());
  EXPECT_TRUE(sc.Finish());
  EXPECT_TRUE(sc.done());
}

TEST(JsonStreamScannerTest, DepthLimit) {
  EXPECT_TRUE(ScanAll(std::string(JsonStreamScanner::kMaxDepth, '[') +
                      std::string(JsonStreamScanner::kMaxDepth, ']')));
  EXPECT_FALSE(ScanAll(std::string(JsonStreamScanner::kMaxDepth + 1, '[') +
                       std::string(JsonStreamScanner::kMaxDepth + 1, ']')));
}

}  // namespace
}  // namespace agentkv::text::output
