// AgentBinding: the ids a request carries, billing-header stripping before
// rendering, new messages for the history, and identification of chat
// requests on the default model (a conversation's later turns find the
// agent of its first).
#include "api/agent_binding.h"

#include <filesystem>

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

TEST(AgentBindingTest, HintsFromBodyAndHeaders) {
  HttpRequest req;
  req.headers["x-session-id"] = "hdr";
  req.headers["x-claude-code-session-id"] = "claude";
  json body = {{"agent_id", "ag"},
               {"prompt_cache_key", "pck"},
               {"metadata", {{"user_id", "user_1_account_2_session_s-9"}}}};
  agent::IdentityHints h = AgentBinding::Hints(req, body);
  EXPECT_EQ(h.body_id, "ag");
  EXPECT_EQ(h.prompt_cache_key, "pck");
  EXPECT_EQ(h.session_header, "hdr");
  EXPECT_EQ(h.claude_session, "claude");
  EXPECT_EQ(h.metadata_user_id, "user_1_account_2_session_s-9");
  body["session_id"] = "sess";
  EXPECT_EQ(AgentBinding::Hints(req, body).body_id, "sess");
  // Mistyped fields are ignored, not trusted.
  body = {{"session_id", 5}, {"metadata", "x"}};
  h = AgentBinding::Hints(HttpRequest{}, body);
  EXPECT_TRUE(h.body_id.empty());
  EXPECT_TRUE(h.metadata_user_id.empty());
}

// The engine's cache salt: the tenant and the body's "cache_salt", never
// two pairs on one salt; nothing at all without either (the unsalted
// cache of a single user, as before tenants).
TEST(AgentBindingTest, CacheSaltFromTenantAndBody) {
  HttpRequest none;
  EXPECT_EQ(*AgentBinding::CacheSalt(none, json::object()), "");
  EXPECT_EQ(*AgentBinding::CacheSalt(none, json{{"cache_salt", nullptr}}), "");
  HttpRequest ab;
  ab.tenant = "ab";
  HttpRequest a;
  a.tenant = "a";
  const std::string t_ab = *AgentBinding::CacheSalt(ab, json::object());
  EXPECT_FALSE(t_ab.empty());
  EXPECT_NE(t_ab, *AgentBinding::CacheSalt(a, json::object()));
  EXPECT_NE(*AgentBinding::CacheSalt(ab, json{{"cache_salt", "c"}}),
            *AgentBinding::CacheSalt(a, json{{"cache_salt", "bc"}}));
  EXPECT_NE(*AgentBinding::CacheSalt(ab, json{{"cache_salt", "c"}}), t_ab);
  EXPECT_NE(*AgentBinding::CacheSalt(none, json{{"cache_salt", "c"}}), "");
  EXPECT_EQ(*AgentBinding::CacheSalt(ab, json{{"cache_salt", "c"}}),
            *AgentBinding::CacheSalt(ab, json{{"cache_salt", "c"}}));
  for (const json& bad : {json(1), json(""), json::array(),
                          json(std::string(AgentBinding::kMaxCacheSaltBytes + 1, 'x'))}) {
    auto r = AgentBinding::CacheSalt(ab, json{{"cache_salt", bad}});
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad.dump();
  }
  EXPECT_TRUE(AgentBinding::CacheSalt(
                  ab, json{{"cache_salt", std::string(AgentBinding::kMaxCacheSaltBytes, 'x')}})
                  .ok());
}

TEST(AgentBindingTest, NormalizeStripsBillingHeaderFromSystemMessages) {
  ordered_json msgs = ordered_json::parse(R"([
    {"role": "system", "content": "x-anthropic-billing-header: cc_version=1; cch=abc;\nYou are Claude Code."},
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "reply"},
    {"role": "user", "content": "second"}])");
  agent::ContentKey key = AgentBinding::NormalizeSystem(&msgs);
  EXPECT_EQ(msgs[0]["content"], "You are Claude Code.");
  EXPECT_EQ(key.system, "You are Claude Code.");
  EXPECT_EQ(key.first_user, "first");
  ordered_json fresh = AgentBinding::NewMessages(msgs);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0]["content"], "second");
  msgs.erase(2);
  EXPECT_EQ(AgentBinding::NewMessages(msgs).size(), 3u);  // no assistant yet: all of them
}

TEST(AgentBindingTest, LaterTurnsFindTheFirstTurnsAgent) {
  const std::string dir = std::string(AGENTKV_DATA_DIR) + "/models/default";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "default model missing";
  ServedModelOptions o;
  o.model_dir = dir;
  o.backend.threads = 1;
  auto m = ServedModel::Load(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  agent::AgentManager agents(nullptr);
  auto identify = [&](ordered_json msgs) {
    agent::ContentKey key = AgentBinding::NormalizeSystem(&msgs);
    auto tokens = (*m)->EncodeChat(msgs, nullptr);
    EXPECT_TRUE(tokens.ok());
    auto id = AgentBinding::Identify(**m, agents, {}, key, msgs, nullptr, {}, *tokens);
    EXPECT_TRUE(id.ok());
    return std::make_pair(*id, *tokens);
  };
  ordered_json turn1 = ordered_json::parse(R"([
    {"role": "system", "content": "x-anthropic-billing-header: cch=1;\nYou are a helpful agent."},
    {"role": "user", "content": "Plan the work."}])");
  auto [first, tokens1] = identify(turn1);
  EXPECT_EQ(first.source, agent::IdSource::kNew);
  // The same conversation with another billing header: the same new id.
  ordered_json again = turn1;
  again[0]["content"] = "x-anthropic-billing-header: cch=2;\nYou are a helpful agent.";
  EXPECT_EQ(identify(again).first.agent_id, first.agent_id);
  // After the turn, the agent is known by its tokens: turn 2 (with the
  // reply and a new question) matches by content.
  std::vector<int32_t> generated = {100, 200, 300};
  std::vector<int32_t> all = tokens1;
  all.insert(all.end(), generated.begin(), generated.end());
  agents.identifier().Remember(first.agent_id, all);
  ordered_json turn2 = turn1;
  turn2.push_back({{"role", "assistant"}, {"content", "Step one."}});
  turn2.push_back({{"role", "user"}, {"content", "Go on."}});
  auto [second, tokens2] = identify(turn2);
  EXPECT_EQ(second.agent_id, first.agent_id);
  EXPECT_EQ(second.source, agent::IdSource::kContent);
  // Another conversation sharing only the system prompt is not that agent.
  ordered_json other = ordered_json::parse(R"([
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "Something else entirely."}])");
  auto [third, tokens3] = identify(other);
  EXPECT_NE(third.agent_id, first.agent_id);
  EXPECT_EQ(third.source, agent::IdSource::kNew);
}

}  // namespace
}  // namespace agentkv::api
