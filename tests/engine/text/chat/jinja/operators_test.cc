// Integer arithmetic at the edges of int64: Python's integers never
// overflow, ours are 64-bit, so a result outside the range is a template
// error, never undefined behaviour (found by fuzz/jinja_template_fuzz:
// `{{ 11111111**10 }}`), and `**` takes O(log n) steps.
#include <string>

#include <gtest/gtest.h>

#include "engine/text/chat/jinja/template.h"

namespace agentkv::text::chat::jinja {
namespace {

Result<std::string> Render(const std::string& source) {
  auto t = Template::Parse(source);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t->Render(nlohmann::ordered_json::object());
}

void ExpectOutOfRange(const std::string& source) {
  auto r = Render(source);
  ASSERT_FALSE(r.ok()) << source << " rendered " << *r;
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().ToString();
}

TEST(OperatorsTest, OverflowingIntegerResultsAreErrors) {
  ExpectOutOfRange("{{ 11111111 ** 10 }}");
  ExpectOutOfRange("{{ 9223372036854775807 + 1 }}");
  ExpectOutOfRange("{{ -9223372036854775807 - 2 }}");
  ExpectOutOfRange("{{ 3037000500 * 3037000500 }}");
  ExpectOutOfRange("{{ (-9223372036854775807 - 1) // -1 }}");
  ExpectOutOfRange("{{ -(-9223372036854775807 - 1) }}");
}

TEST(OperatorsTest, ResultsAtTheEdgesOfTheRangeAreExact) {
  EXPECT_EQ(*Render("{{ 2 ** 62 }}"), "4611686018427387904");
  EXPECT_EQ(*Render("{{ (-2) ** 63 }}"), "-9223372036854775808");
  EXPECT_EQ(*Render("{{ 9223372036854775806 + 1 }}"), "9223372036854775807");
  EXPECT_EQ(*Render("{{ (-9223372036854775807 - 1) % -1 }}"), "0");
  EXPECT_EQ(*Render("{{ 7 // -2 }} {{ 7 % -2 }} {{ 3 ** 0 }}"), "-4 -1 1");
}

TEST(OperatorsTest, HugeExponentsOfSmallBasesEnd) {
  EXPECT_EQ(*Render("{{ 1 ** 1000000000000000000 }}"), "1");
  EXPECT_EQ(*Render("{{ (-1) ** 1000000000000000001 }}"), "-1");
  EXPECT_EQ(*Render("{{ 0 ** 1000000000000000000 }}"), "0");
}

}  // namespace
}  // namespace agentkv::text::chat::jinja
