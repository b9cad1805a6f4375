// AgentIdentifier: SPEC section 4's identification order, Claude Code's
// session sources, billing-header stripping and content matching.
#include "agent/agent_identifier.h"

#include <gtest/gtest.h>

namespace agentkv::agent {
namespace {

TEST(AgentIdentifierTest, StripsBillingHeaderLines) {
  const std::string sys =
      "x-anthropic-billing-header: cc_version=2.0.14.abc; cc_entrypoint=cli; cch=1234;\n"
      "You are Claude Code.\nBe brief.\n";
  EXPECT_EQ(AgentIdentifier::StripVolatileLines(sys), "You are Claude Code.\nBe brief.\n");
  // Any case, leading blanks, in the middle, and the blank line it leaves.
  EXPECT_EQ(AgentIdentifier::StripVolatileLines("  X-Anthropic-Billing-Header: a=1\n\nHello"),
            "Hello");
  EXPECT_EQ(AgentIdentifier::StripVolatileLines("A\nx-anthropic-billing-header: b\nB"), "A\nB");
  // Nothing to strip: unchanged, blank lines included.
  EXPECT_EQ(AgentIdentifier::StripVolatileLines("\n\nplain\n"), "\n\nplain\n");
  EXPECT_EQ(AgentIdentifier::StripVolatileLines("mentions x-anthropic-billing-header: inline"),
            "mentions x-anthropic-billing-header: inline");
}

TEST(AgentIdentifierTest, NewIdIgnoresBillingHeaderAndTrailingBlanks) {
  const ContentKey a{
      AgentIdentifier::StripVolatileLines("x-anthropic-billing-header: cch=1;\nYou are helpful."),
      "hi"};
  const ContentKey b{
      AgentIdentifier::StripVolatileLines("x-anthropic-billing-header: cch=2;\nYou are helpful.\n"),
      "hi "};
  EXPECT_EQ(AgentIdentifier::NewAgentId(a), AgentIdentifier::NewAgentId(b));
  EXPECT_EQ(AgentIdentifier::NewAgentId(a).rfind("auto-", 0), 0u);
  EXPECT_EQ(AgentIdentifier::NewAgentId(a).size(), 5u + 16u);
  EXPECT_NE(AgentIdentifier::NewAgentId(a),
            AgentIdentifier::NewAgentId({"You are helpful.", "hello"}));
  // The parts are length-delimited: moving text across them changes the id.
  EXPECT_NE(AgentIdentifier::NewAgentId({"ab", "c"}), AgentIdentifier::NewAgentId({"a", "bc"}));
}

TEST(AgentIdentifierTest, SessionFromClaudeCodeUserId) {
  EXPECT_EQ(AgentIdentifier::SessionFromUserId(
                "user_0a1b2c_account_11111111-2222-3333-4444-555555555555_session_"
                "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"),
            "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
  EXPECT_EQ(AgentIdentifier::SessionFromUserId(R"({"device_id":"d","session_id":"s-1"})"), "s-1");
  EXPECT_FALSE(AgentIdentifier::SessionFromUserId("user_0a1b2c").has_value());
  EXPECT_FALSE(AgentIdentifier::SessionFromUserId("user_x_session_").has_value());
  EXPECT_FALSE(AgentIdentifier::SessionFromUserId(R"({"device_id":"d"})").has_value());
  EXPECT_FALSE(AgentIdentifier::SessionFromUserId("").has_value());
}

TEST(AgentIdentifierTest, ExplicitIdOrder) {
  IdentityHints h;
  h.metadata_user_id = "user_1_account_2_session_meta";
  auto id = AgentIdentifier::ExplicitId(h);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->agent_id, "meta");
  EXPECT_EQ(id->source, IdSource::kExplicit);
  h.claude_session = "claude";
  EXPECT_EQ(AgentIdentifier::ExplicitId(h)->agent_id, "claude");
  h.session_header = "header";
  EXPECT_EQ(AgentIdentifier::ExplicitId(h)->agent_id, "header");
  h.prompt_cache_key = "pck";
  EXPECT_EQ(AgentIdentifier::ExplicitId(h)->agent_id, "pck");
  h.body_id = "body";
  EXPECT_EQ(AgentIdentifier::ExplicitId(h)->agent_id, "body");
  h.path_id = "path";
  EXPECT_EQ(AgentIdentifier::ExplicitId(h)->agent_id, "path");
  EXPECT_EQ(AgentIdentifier::ExplicitId(h)->source, IdSource::kPath);
  EXPECT_TRUE(AgentIdentifier::ExplicitId({})->agent_id.empty());
  // Ids must be valid store ids.
  IdentityHints bad;
  bad.session_header = std::string(300, 'x');
  EXPECT_EQ(AgentIdentifier::ExplicitId(bad).status().code(), StatusCode::kInvalidArgument);
  bad.session_header = std::string("a\0b", 3);
  EXPECT_EQ(AgentIdentifier::ExplicitId(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(AgentIdentifierTest, ContentMatchNeedsTheFirstTurn) {
  AgentIdentifier ids;
  ids.Remember("a", {1, 2, 3, 4, 5, 6, 7, 8});
  ids.Remember("b", {1, 2, 3, 9, 9});
  const std::vector<int32_t> req = {1, 2, 3, 4, 5, 6, 10, 11};
  // Longest common prefix wins: "a" shares 6 tokens, "b" 3.
  EXPECT_EQ(ids.Match(req, 4), "a");
  EXPECT_FALSE(ids.Match(req, 7).has_value());
  EXPECT_FALSE(ids.Match(std::vector<int32_t>{5, 5}, 0).has_value());

  const ContentKey key{"sys", "first"};
  bool asked = false;
  auto id = ids.Identify({}, key, req, [&] {
    asked = true;
    return size_t{5};
  });
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(asked);
  EXPECT_EQ(id->agent_id, "a");
  EXPECT_EQ(id->source, IdSource::kContent);
  // The match does not cover the system prompt and first turn: a new agent.
  id = ids.Identify({}, key, req, [] { return size_t{7}; });
  EXPECT_EQ(id->source, IdSource::kNew);
  EXPECT_EQ(id->agent_id, AgentIdentifier::NewAgentId(key));
  // An explicit id wins over content, without computing the first turn.
  IdentityHints h;
  h.session_header = "s";
  asked = false;
  id = ids.Identify(h, key, req, [&] {
    asked = true;
    return size_t{0};
  });
  EXPECT_EQ(id->agent_id, "s");
  EXPECT_FALSE(asked);
  // Ties go to the most recently remembered; forgotten agents never match.
  ids.Remember("c", {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(ids.Match(req, 1), "c");
  ids.Forget("c");
  ids.Forget("a");
  EXPECT_EQ(ids.Match(req, 1), "b");
  EXPECT_EQ(ids.size(), 1u);
}

TEST(AgentIdentifierTest, RemembersAtMostMaxKnown) {
  AgentIdentifier ids(2);
  ids.Remember("a", {1, 2, 3});
  ids.Remember("b", {4, 5, 6});
  ids.Remember("a", {1, 2, 3, 4});  // "a" is now the most recent
  ids.Remember("c", {7, 8, 9});     // forgets "b"
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_FALSE(ids.Match(std::vector<int32_t>{4, 5, 6}, 1).has_value());
  EXPECT_EQ(ids.Match(std::vector<int32_t>{1, 2, 3, 4}, 1), "a");
  EXPECT_EQ(ids.Match(std::vector<int32_t>{7, 8, 9}, 1), "c");
  // What reply reuse reads: the latest sequence, none once forgotten.
  EXPECT_EQ(ids.Remembered("a"), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_TRUE(ids.Remembered("b").empty());
  ids.Forget("c");
  EXPECT_TRUE(ids.Remembered("c").empty());
  ids.ForgetAll();
  EXPECT_TRUE(ids.Remembered("a").empty());
}

TEST(AgentIdentifierTest, RemembersAtMostMaxTokensInAll) {
  AgentIdentifier id(/*max_known=*/100, /*max_tokens=*/1000);
  auto seq = [](int n, int32_t base) {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = base + i;
    return v;
  };
  id.Remember("a", seq(600, 1));
  id.Remember("b", seq(300, 5000));
  EXPECT_EQ(id.size(), 2u);
  EXPECT_EQ(id.tokens(), 900u);
  id.Remember("c", seq(300, 9000));  // 1,200 > 1,000: the oldest goes
  EXPECT_EQ(id.size(), 2u);
  EXPECT_EQ(id.tokens(), 600u);
  EXPECT_TRUE(id.Remembered("a").empty());
  EXPECT_FALSE(id.Match(seq(600, 1), 10).has_value());
  EXPECT_EQ(id.Match(seq(300, 5000), 10), "b");
  // Replacing a sequence counts only the new one.
  id.Remember("b", seq(100, 5000));
  EXPECT_EQ(id.tokens(), 400u);
  // One sequence larger than the bound is kept alone (the newest).
  id.Remember("d", seq(2000, 20000));
  EXPECT_EQ(id.size(), 1u);
  EXPECT_EQ(id.Match(seq(2000, 20000), 10), "d");
  id.Forget("d");
  EXPECT_EQ(id.tokens(), 0u);
}

TEST(AgentIdentifierTest, TenantsNeverShareAnAgent) {
  EXPECT_EQ(*AgentIdentifier::Scope("", "x"), "x");
  EXPECT_EQ(*AgentIdentifier::Scope("acme", "x"), "acme/x");
  EXPECT_EQ(AgentIdentifier::Unscope("acme", "acme/x"), "x");
  EXPECT_EQ(AgentIdentifier::Unscope("", "acme/x"), "acme/x");
  // The scope takes room from the 256-byte id.
  EXPECT_EQ(AgentIdentifier::Scope("acme", std::string(252, 'a')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(AgentIdentifier::Scope("acme", std::string(251, 'a')).ok());

  // The same explicit id names two agents under two tenants.
  IdentityHints a, b;
  a.session_header = b.session_header = "shared";
  a.tenant = "acme";
  b.tenant = "zeta";
  EXPECT_EQ(AgentIdentifier::ExplicitId(a)->agent_id, "acme/shared");
  EXPECT_EQ(AgentIdentifier::ExplicitId(b)->agent_id, "zeta/shared");
  // Another tenant's "acme/shared" is not acme's agent either.
  IdentityHints forged;
  forged.path_id = "acme/shared";
  forged.tenant = "zeta";
  EXPECT_EQ(AgentIdentifier::ExplicitId(forged)->agent_id, "zeta/acme/shared");

  // Content matching looks only at the tenant's own agents.
  AgentIdentifier id;
  const std::vector<int32_t> conv = {5, 6, 7, 8, 9, 10};
  id.Remember("acme/a1", conv);
  std::vector<int32_t> next = conv;
  next.push_back(11);
  IdentityHints none_a, none_b;
  none_a.tenant = "acme";
  none_b.tenant = "zeta";
  const ContentKey key{"sys", "hi"};
  auto ra = id.Identify(none_a, key, next, [] { return size_t{3}; });
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra->agent_id, "acme/a1");
  EXPECT_EQ(ra->source, IdSource::kContent);
  auto rb = id.Identify(none_b, key, next, [] { return size_t{3}; });
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->source, IdSource::kNew);
  EXPECT_EQ(rb->agent_id, "zeta/" + AgentIdentifier::NewAgentId(key));
  EXPECT_FALSE(id.Match(next, 3, "zeta/").has_value());
  EXPECT_EQ(id.Match(next, 3, "acme/"), "acme/a1");
}

}  // namespace
}  // namespace agentkv::agent
