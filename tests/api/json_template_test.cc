#include "api/json_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

namespace agentkv::api {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

TEST(JsonTemplateTest, StringsMatchNlohmannByteForByte) {
  std::vector<std::string> cases = {"",
                                    "hello",
                                    "a\"b\\c",
                                    "\b\f\n\r\t",
                                    "\x7f",
                                    "/slash/",
                                    "caf\xc3\xa9",
                                    "\xe2\x82\xac",
                                    "\xf0\x9f\x98\x80",
                                    "bad \xc3 utf8",
                                    "\xff\xfe",
                                    "lone \x80 continuation"};
  for (int c = 0; c < 0x80; ++c) cases.push_back(std::string(1, static_cast<char>(c)));
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 12, ' ');
    // Mostly ASCII with control characters, sometimes any byte.
    for (char& ch : s) ch = static_cast<char>(i % 4 == 0 ? rng() % 256 : rng() % 128);
    cases.push_back(s);
  }
  for (const std::string& s : cases) {
    std::string out = "x";
    JsonTemplate::AppendString(s, &out);
    EXPECT_EQ(out, "x" + Dump(json(s)))
        << json(s).dump(-1, ' ', true, json::error_handler_t::replace);
  }
}

TEST(JsonTemplateTest, RendersTheDocumentWithTheTextInTheHole) {
  const json doc = {{"id", "c1"},
                    {"choices", json::array({{{"delta", {{"content", JsonTemplate::kHole}}},
                                              {"index", 0},
                                              {"finish_reason", nullptr}}})}};
  const JsonTemplate t("data: ", Dump(doc), "\n\n");
  for (const std::string text : {"", "He said \"hi\"\n", "\xc3\xa9t\xc3\xa9", "\x01"}) {
    json filled = doc;
    filled["choices"][0]["delta"]["content"] = text;
    std::string out = "prev;";
    t.Render(text, &out);
    EXPECT_EQ(out, "prev;data: " + Dump(filled) + "\n\n");
  }
}

TEST(JsonTemplateTest, ADocumentWithoutAHoleRendersUnchanged) {
  const JsonTemplate t("a", "{\"x\":1}", "b");
  std::string out;
  t.Render("ignored", &out);
  EXPECT_EQ(out, "a{\"x\":1}b");
}

}  // namespace
}  // namespace agentkv::api
