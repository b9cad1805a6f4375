// TenantKeys: the --api-keys file's syntax, its refusals (naming the line,
// never quoting a key) and key lookup.
#include "api/tenant_keys.h"

#include <gtest/gtest.h>

#include <string>

namespace agentkv::api {
namespace {

TEST(TenantKeysTest, ParsesKeysTenantsAndTheHighFlag) {
  auto t = TenantKeys::Parse(
      "# keys\n"
      "\n"
      "aaaaaaaaaaaaaaaa-key alice\n"
      "  bbbbbbbbbbbbbbbb-key bob.team-2 high  \n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->size(), 2u);
  const Tenant* a = (*t)->Find("aaaaaaaaaaaaaaaa-key");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "alice");
  EXPECT_FALSE(a->high_priority);
  const Tenant* b = (*t)->Find("bbbbbbbbbbbbbbbb-key");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->name, "bob.team-2");
  EXPECT_TRUE(b->high_priority);
  EXPECT_EQ((*t)->Find("aaaaaaaaaaaaaaaa-ke"), nullptr);
  EXPECT_EQ((*t)->Find("aaaaaaaaaaaaaaaa-key "), nullptr);
  EXPECT_EQ((*t)->Find(""), nullptr);
  EXPECT_EQ((*t)->Find("alice"), nullptr);
}

TEST(TenantKeysTest, RefusesMalformedLinesWithoutQuotingKeys) {
  // std::string: the last one is built here and must outlive the loop.
  const std::string bad[] = {
      "aaaaaaaaaaaaaaaa-key\n",                                  // no tenant
      "short alice\n",                                           // key too short
      "aaaaaaaaaaaaaaaa-key ali/ce\n",                           // '/' splits scopes
      "aaaaaaaaaaaaaaaa-key alice urgent\n",                     // unknown flag
      "aaaaaaaaaaaaaaaa-key alice high more\n",                  // extra field
      "aaaaaaaaaaaaaaaa-key alice\naaaaaaaaaaaaaaaa-key bob\n",  // repeated key
      "aaaaaaaaaaaaaaaa-key " + std::string(65, 't') + "\n"};
  int line_two = 0;
  for (const std::string& text : bad) {
    auto t = TenantKeys::Parse(text);
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(t.status().message().find("aaaaaaaaaaaaaaaa"), std::string::npos)
        << t.status().message();
    line_two += t.status().message().find("line 2") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(line_two, 1);  // the repeated key is named by its line
  EXPECT_EQ(TenantKeys::Load("/nonexistent/keys").status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace agentkv::api
