// AgentManager and AgentTurn on the real default model, each scenario on
// both history stores (the LMDB store and, without one, the memory store):
// one agent's turns run in arrival order (the second sees the history and
// the cache the first left), a cancelled queued turn lets the next one run,
// Delete removes the agent everywhere, listing pages by id. Then what only
// one store does: stored KV chains feed content matching; the memory
// store's bound drops whole agents.
#include "agent/agent_manager.h"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "cache/block_hash.h"
#include "engine/backend/backend_factory.h"
#include "engine/text/tokenizer.h"
#include "store/store_kv_tier.h"

namespace agentkv::agent {
namespace {

namespace fs = std::filesystem;

class AgentManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path dir = fs::path(AGENTKV_DATA_DIR) / "models/default";
    if (!fs::exists(dir / "config.json")) GTEST_SKIP() << "default model missing (run setup)";
    backend::BackendOptions bo;
    bo.threads = 1;
    auto backend = backend::CreateBackend(dir, bo);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    engine::EngineOptions eo;
    eo.scheduler.max_batch = 4;
    eo.kv_memory_bytes = 32ull << 20;
    auto engine = engine::Engine::Create(std::move(backend).value(), nullptr, eo);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(engine).value();
    std::string tmpl = (fs::temp_directory_path() / "agentkv_agent_XXXXXX").string();
    store_dir_ = ::mkdtemp(tmpl.data());
    store::StoreOptions so;
    so.sync = false;
    auto st = store::AgentStore::Open(store_dir_, so);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    store_ = std::move(st).value();
    manager_ = std::make_unique<AgentManager>(store_.get());
  }
  void TearDown() override {
    manager_.reset();
    if (engine_) engine_->Stop();
    store_.reset();
    if (!store_dir_.empty()) fs::remove_all(store_dir_);
  }

  PrepareFn Prompt(std::vector<int32_t> prompt) {
    return [this, prompt]() -> Result<TurnStart> {
      TurnStart s;
      s.engine = engine_.get();
      s.request.prompt = prompt;
      s.request.params.temperature = 0;
      s.request.params.max_tokens = 4;
      return s;
    };
  }

  static bool WaitFor(const std::function<bool()>& cond) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!cond()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // Drains a running turn's stream to its kFinished event and completes it.
  static engine::RequestOutput Finish(AgentTurn& turn, const std::string& record,
                                      uint32_t* number) {
    EXPECT_TRUE(WaitFor([&] { return turn.state() != AgentTurn::State::kQueued; }));
    EXPECT_EQ(turn.state(), AgentTurn::State::kRunning) << turn.error().ToString();
    std::vector<int32_t> generated;
    engine::RequestOutput ev;
    auto stream = turn.stream();
    while (stream) {
      ev = stream->Pop();
      generated.insert(generated.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.kind != engine::RequestOutput::Kind::kDelta) break;
    }
    EXPECT_EQ(ev.kind, engine::RequestOutput::Kind::kFinished);
    auto n = turn.Complete(record, generated, ev);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (n.ok() && number) *number = *n;
    return ev;
  }

  std::string store_dir_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<store::AgentStore> store_;
  std::unique_ptr<AgentManager> manager_;
};

enum class Kind { kLmdb, kMemory };

// The same scenarios with the manager on the LMDB store or on none (its
// own memory store).
class AgentManagerOnBothStores : public AgentManagerTest,
                                 public ::testing::WithParamInterface<Kind> {
 protected:
  void SetUp() override {
    AgentManagerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    manager_ = Make();
  }
  std::unique_ptr<AgentManager> Make(AgentManagerOptions o = {}) {
    return std::make_unique<AgentManager>(GetParam() == Kind::kLmdb ? store_.get() : nullptr, o);
  }
};

std::vector<int32_t> Tokens(int n, int32_t base) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + (i * 7) % 1000);
  return t;
}

TEST_P(AgentManagerOnBothStores, OneAgentsTurnsRunInOrderAndTheSecondSeesTheFirst) {
  const std::vector<int32_t> p1 = Tokens(48, 100);
  size_t history_seen_by_second = 99;
  auto t1 = manager_->NewTurn("agent-1", Prompt(p1));
  auto t2 = manager_->NewTurn("agent-1", [&, p1]() -> Result<TurnStart> {
    // Runs only once the first turn is recorded.
    auto h = manager_->History("agent-1");
    history_seen_by_second = h.ok() ? h->size() : 0;
    std::vector<int32_t> p2 = p1;
    for (int32_t t : Tokens(20, 3000)) p2.push_back(t);
    return Prompt(p2)();
  });
  AgentTurn::Start(t1, [] {});
  AgentTurn::Start(t2, [] {});
  EXPECT_EQ(t2->queued_behind(), 1u);
  uint32_t n1 = 0, n2 = 0;
  engine::RequestOutput f1 = Finish(*t1, R"([{"role":"user","content":"one"}])", &n1);
  EXPECT_EQ(f1.cached_tokens, 0);
  engine::RequestOutput f2 = Finish(*t2, R"([{"role":"user","content":"two"}])", &n2);
  EXPECT_EQ(n1, 1u);
  EXPECT_EQ(n2, 2u);
  EXPECT_EQ(history_seen_by_second, 1u);
  EXPECT_EQ(manager_->store(), GetParam() == Kind::kLmdb ? store_.get() : nullptr);
  // The first turn's KV stayed resident for the agent.
  EXPECT_GE(f2.cached_tokens, 32);
  EXPECT_EQ(f2.prompt_tokens, 68);

  auto info = manager_->Get("agent-1");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->turns, 2u);
  EXPECT_EQ(info->last_cached_tokens, f2.cached_tokens);
  EXPECT_EQ(info->pending, 0u);
  EXPECT_GT(info->resident_tokens, 68);
  EXPECT_EQ(manager_->resume_counts().resident + manager_->resume_counts().disk, 1);
  auto history = manager_->History("agent-1");
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 2u);
  EXPECT_EQ(nlohmann::json::parse((*history)[1])[0]["content"], "two");
  // Content matching now knows the agent's tokens.
  std::vector<int32_t> next = p1;
  next.push_back(5);
  EXPECT_EQ(manager_->identifier().Match(next, 40), "agent-1");
}

TEST_P(AgentManagerOnBothStores, CancelledQueuedTurnLetsTheNextRun) {
  auto t1 = manager_->NewTurn("a", Prompt(Tokens(20, 10)));
  bool prepared2 = false;
  auto t2 = manager_->NewTurn("a", [&]() -> Result<TurnStart> {
    prepared2 = true;
    return Prompt(Tokens(20, 10))();
  });
  auto t3 = manager_->NewTurn("a", Prompt(Tokens(24, 10)));
  AgentTurn::Start(t1, [] {});
  AgentTurn::Start(t2, [] {});
  AgentTurn::Start(t3, [] {});
  t2->Cancel();
  Finish(*t1, "[]", nullptr);
  uint32_t n3 = 0;
  Finish(*t3, "[]", &n3);
  EXPECT_FALSE(prepared2);
  EXPECT_EQ(t2->state(), AgentTurn::State::kCancelled);
  EXPECT_EQ(n3, 2u);
}

TEST_P(AgentManagerOnBothStores, FailedPrepareReleasesTheStrand) {
  auto t1 = manager_->NewTurn("a", [] { return Result<TurnStart>(InvalidArgument("too long")); });
  auto t2 = manager_->NewTurn("a", Prompt(Tokens(8, 10)));
  AgentTurn::Start(t1, [] {});
  AgentTurn::Start(t2, [] {});
  EXPECT_EQ(t1->state(), AgentTurn::State::kFailed);
  EXPECT_EQ(t1->error().code(), StatusCode::kInvalidArgument);
  uint32_t n = 0;
  Finish(*t2, "[]", &n);
  EXPECT_EQ(n, 1u);
}

TEST_P(AgentManagerOnBothStores, ThrowingPrepareFailsTheTurnAndReleasesTheStrand) {
  // Tasks start on an executor that, like the server's worker pool, logs
  // and drops what a task throws.
  AgentManagerOptions o;
  o.executor = [](std::function<void()> f) {
    try {
      f();
    } catch (...) {
    }
  };
  std::unique_ptr<AgentManager> m = Make(o);
  auto t1 = m->NewTurn("a", []() -> Result<TurnStart> { throw std::runtime_error("boom"); });
  auto t2 = m->NewTurn("a", Prompt(Tokens(8, 10)));
  bool woke = false;
  AgentTurn::Start(t1, [&] { woke = true; });
  AgentTurn::Start(t2, [] {});
  // The turn's consumer hears of it (else it would wait for a turn that
  // never runs), and the agent's next turn runs.
  EXPECT_EQ(t1->state(), AgentTurn::State::kFailed);
  EXPECT_EQ(t1->error().code(), StatusCode::kInternal);
  EXPECT_TRUE(woke);
  uint32_t n = 0;
  Finish(*t2, "[]", &n);
  EXPECT_EQ(n, 1u);
}

TEST_P(AgentManagerOnBothStores, FirstTurnCancelledAfterTheEngineFinishedLeavesNoResidentKv) {
  // The engine finished the agent's first turn and kept its KV for the
  // agent; the client went away before the turn was recorded.
  auto t1 = manager_->NewTurn("fresh", Prompt(Tokens(48, 10)));
  AgentTurn::Start(t1, [] {});
  ASSERT_TRUE(WaitFor([&] { return t1->state() != AgentTurn::State::kQueued; }));
  ASSERT_EQ(t1->state(), AgentTurn::State::kRunning);
  while (t1->stream()->Pop().kind == engine::RequestOutput::Kind::kDelta) {
  }
  EXPECT_GT(engine_->AgentResidentTokens("fresh"), 0);
  t1->Cancel();
  // A later request's end means the engine has handled what came before.
  auto other = manager_->NewTurn("other", Prompt(Tokens(40, 2000)));
  AgentTurn::Start(other, [] {});
  Finish(*other, "[]", nullptr);
  // No agent "fresh" exists to list or delete: nothing is kept for it.
  EXPECT_EQ(manager_->Get("fresh").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->AgentResidentTokens("fresh"), 0);
  EXPECT_EQ(engine_->Stats().resident_agents, 1);

  // An agent with a recorded turn keeps what its cancelled turn left (its
  // next turn resumes from the common prefix; Delete drops it).
  auto k1 = manager_->NewTurn("known", Prompt(Tokens(48, 500)));
  AgentTurn::Start(k1, [] {});
  Finish(*k1, "[]", nullptr);
  std::vector<int32_t> p2 = Tokens(48, 500);
  for (int32_t t : Tokens(16, 3000)) p2.push_back(t);
  auto k2 = manager_->NewTurn("known", Prompt(p2));
  AgentTurn::Start(k2, [] {});
  ASSERT_TRUE(WaitFor([&] { return k2->state() != AgentTurn::State::kQueued; }));
  while (k2->stream()->Pop().kind == engine::RequestOutput::Kind::kDelta) {
  }
  k2->Cancel();
  auto other2 = manager_->NewTurn("other", Prompt(Tokens(40, 2000)));
  AgentTurn::Start(other2, [] {});
  Finish(*other2, "[]", nullptr);
  EXPECT_GT(engine_->AgentResidentTokens("known"), 48);
}

TEST_P(AgentManagerOnBothStores, DeleteRemovesHistoryAndRunsAfterQueuedTurns) {
  auto t1 = manager_->NewTurn("gone", Prompt(Tokens(40, 10)));
  AgentTurn::Start(t1, [] {});
  bool dropped = false;
  std::atomic<bool> deleted{false};
  Status result = Internal("not run");
  manager_->Delete(
      "gone", [&] { dropped = true; },
      [&](Status s) {
        result = s;
        deleted = true;
      });
  EXPECT_FALSE(deleted.load());  // waits for the running turn
  Finish(*t1, "[]", nullptr);
  ASSERT_TRUE(WaitFor([&] { return deleted.load(); }));
  EXPECT_TRUE(result.ok()) << result.ToString();
  EXPECT_TRUE(dropped);
  EXPECT_EQ(manager_->Get("gone").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(manager_->History("gone").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(manager_->identifier().size(), 0u);
  auto list = manager_->List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  // Deleting an unknown agent: NotFound.
  deleted = false;
  manager_->Delete("never", nullptr, [&](Status s) {
    result = s;
    deleted = true;
  });
  EXPECT_TRUE(deleted.load());
  EXPECT_EQ(result.code(), StatusCode::kNotFound);
}

TEST_F(AgentManagerTest, ContentMatchingKnowsStoredChainsAfterARestart) {
  auto fp = store::ModelFingerprint::FromHex(std::string(32, 'a'));
  auto other = store::ModelFingerprint::FromHex(std::string(32, 'b'));
  ASSERT_TRUE(fp.ok() && other.ok());
  const std::vector<int32_t> tokens = Tokens(64, 40);  // 4 blocks of 16
  ASSERT_TRUE(store_->AppendTurn("stored", "[]").ok());
  store::KvChainWrite w;
  w.agent_id = "stored";
  w.fp = *fp;
  const auto hashes = cache::HashFullBlocks(tokens, 16);
  for (size_t i = 0; i < hashes.size(); ++i) {
    store::KvBlockWrite b;
    b.hash = hashes[i];
    b.tokens.assign(tokens.begin() + i * 16, tokens.begin() + (i + 1) * 16);
    b.data = std::string(64, static_cast<char>(i));
    w.blocks.push_back(std::move(b));
  }
  store_->PutKvBlocks(std::move(w));
  ASSERT_TRUE(store_->Flush().ok());
  manager_->identifier().Remember("stale", {1, 2, 3});

  auto n = manager_->RememberStoredChains(*fp);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1u);
  std::vector<int32_t> next = tokens;
  next.push_back(7);
  EXPECT_EQ(manager_->identifier().Match(next, 48), "stored");
  EXPECT_FALSE(manager_->identifier().Match(std::vector<int32_t>{1, 2, 3}, 1).has_value());
  // Another model's chains are not this model's tokens.
  n = manager_->RememberStoredChains(*other);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_FALSE(manager_->identifier().Match(next, 1).has_value());
}

// A turn that would have created its agent and ended unrecorded, at any
// point (cancelled before prefill, mid decode, after the engine finished and
// saved it; or its history could not be written): nothing of it stays in the
// store. Only the LMDB store keeps KV (the memory store keeps none).
TEST_F(AgentManagerTest, UnrecordedFirstTurnLeavesNoKvInTheStore) {
  backend::BackendOptions bo;
  bo.threads = 1;
  auto backend = backend::CreateBackend(fs::path(AGENTKV_DATA_DIR) / "models/default", bo);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto tier =
      store::StoreKvTier::Create(store_.get(), std::string(32, 'c'), (*backend)->kv_format(), 16,
                                 (*backend)->kv_element_size());
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  const store::ModelFingerprint fp = (*tier)->fingerprint();
  engine::EngineOptions eo;
  eo.scheduler.max_batch = 4;
  eo.kv_memory_bytes = 32ull << 20;
  eo.kv_tier = std::move(tier).value();
  auto made = engine::Engine::Create(std::move(backend).value(), nullptr, eo);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  engine_->Stop();
  engine_ = std::move(made).value();

  auto chain = [&](const std::string& id) {
    EXPECT_TRUE(store_->Flush().ok());
    auto c = store_->GetKvChain(id, fp);
    return c.ok() ? c->size() : size_t{999};
  };
  auto stored_blocks = [&](const std::vector<int32_t>& tokens) {
    auto p = store_->LoadKvPrefixForTokens(fp, tokens, 16);
    return p.ok() ? p->blocks.size() : size_t{999};
  };
  // A later request's end means the engine has handled what came before
  // (the drop, and with it the discard queued behind the agent's saves).
  int settles = 0;
  auto settle = [&] {
    const std::string id = "other" + std::to_string(settles++);
    auto other = manager_->NewTurn(id, Prompt(Tokens(20, 2000)));
    AgentTurn::Start(other, [] {});
    Finish(*other, "[]", nullptr);
  };
  auto drain = [](AgentTurn& t) {
    while (t.stream()->Pop().kind == engine::RequestOutput::Kind::kDelta) {
    }
  };

  // 1. Finished by the engine, its KV saved, then the client went away.
  const std::vector<int32_t> p1 = Tokens(48, 10);
  auto t1 = manager_->NewTurn("finished", Prompt(p1));
  AgentTurn::Start(t1, [] {});
  ASSERT_TRUE(WaitFor([&] { return t1->state() != AgentTurn::State::kQueued; }));
  ASSERT_EQ(t1->state(), AgentTurn::State::kRunning);
  drain(*t1);
  ASSERT_TRUE(WaitFor([&] { return chain("finished") >= 3; }));  // in the store
  ASSERT_EQ(stored_blocks(p1), 3u);
  t1->Cancel();
  settle();
  EXPECT_EQ(chain("finished"), 0u);
  EXPECT_EQ(stored_blocks(p1), 0u);  // the blocks hold its tokens

  // 2. Finished and saved, but its history could not be written.
  const std::vector<int32_t> p2 = Tokens(48, 600);
  auto t2 = manager_->NewTurn("unwritten", Prompt(p2));
  AgentTurn::Start(t2, [] {});
  ASSERT_TRUE(WaitFor([&] { return t2->state() != AgentTurn::State::kQueued; }));
  engine::RequestOutput end;
  std::vector<int32_t> generated;
  do {
    end = t2->stream()->Pop();
    generated.insert(generated.end(), end.tokens.begin(), end.tokens.end());
  } while (end.kind == engine::RequestOutput::Kind::kDelta);
  ASSERT_TRUE(WaitFor([&] { return chain("unwritten") >= 3; }));
  EXPECT_EQ(t2->Complete("not json", generated, end).status().code(), StatusCode::kInvalidArgument);
  settle();
  EXPECT_EQ(chain("unwritten"), 0u);
  EXPECT_EQ(stored_blocks(p2), 0u);

  // 3. Cancelled mid decode, and 4. right after it started (before or
  // during its prefill): the engine never saves an unfinished turn.
  const std::vector<int32_t> p3 = Tokens(48, 1200);
  auto t3 = manager_->NewTurn("mid", [&]() -> Result<TurnStart> {
    auto s = Prompt(p3)();
    s->request.params.max_tokens = 64;
    return s;
  });
  AgentTurn::Start(t3, [] {});
  ASSERT_TRUE(WaitFor([&] { return t3->state() != AgentTurn::State::kQueued; }));
  EXPECT_EQ(t3->stream()->Pop().kind, engine::RequestOutput::Kind::kDelta);
  t3->Cancel();
  const std::vector<int32_t> p4 = Tokens(48, 1800);
  auto t4 = manager_->NewTurn("early", Prompt(p4));
  AgentTurn::Start(t4, [] {});
  t4->Cancel();
  settle();
  EXPECT_EQ(chain("mid"), 0u);
  EXPECT_EQ(stored_blocks(p3), 0u);
  EXPECT_EQ(chain("early"), 0u);
  EXPECT_EQ(stored_blocks(p4), 0u);

  // A recorded agent keeps its KV when a later turn is cancelled, and the
  // ids above may start again: their next turns are stored.
  auto k1 = manager_->NewTurn("known", Prompt(Tokens(48, 500)));
  AgentTurn::Start(k1, [] {});
  Finish(*k1, "[]", nullptr);
  auto k2 = manager_->NewTurn("known", Prompt(Tokens(64, 500)));
  AgentTurn::Start(k2, [] {});
  ASSERT_TRUE(WaitFor([&] { return k2->state() != AgentTurn::State::kQueued; }));
  drain(*k2);
  k2->Cancel();
  auto again = manager_->NewTurn("finished", Prompt(p1));
  AgentTurn::Start(again, [] {});
  Finish(*again, "[]", nullptr);
  settle();
  EXPECT_GE(chain("known"), 3u);
  EXPECT_EQ(chain("finished"), 3u);
  EXPECT_EQ(stored_blocks(p1), 3u);
  auto v = store_->Verify();
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok());
}

TEST_F(AgentManagerTest, WithoutAStoreNoChainsAreRememberedAndNothingIsStored) {
  AgentManager m(nullptr);
  auto t = m.NewTurn("mem", Prompt(Tokens(8, 10)));
  AgentTurn::Start(t, [] {});
  Finish(*t, R"([{"role":"user","content":"x"}])", nullptr);
  ASSERT_TRUE(m.History("mem").ok());
  EXPECT_EQ(store_->GetAgent("mem").status().code(), StatusCode::kNotFound);
  m.identifier().Remember("stale", {1, 2, 3});
  auto n = m.RememberStoredChains(store::ModelFingerprint::FromHex(std::string(32, 'a')).value());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 0u);
  EXPECT_EQ(m.identifier().size(), 0u);
}

TEST_F(AgentManagerTest, DroppedInMemoryHistoryTakesWhatWasKnownOfTheAgent) {
  AgentManagerOptions o;
  o.max_memory_history_bytes = 1;  // room for the latest agent's history only
  AgentManager m(nullptr, o);
  for (const char* id : {"m1", "m2"}) {
    auto t = m.NewTurn(id, Prompt(Tokens(8, 10)));
    AgentTurn::Start(t, [] {});
    Finish(*t, R"([{"role":"user","content":"x"}])", nullptr);
  }
  // The runtime knowledge had room; it went with the history.
  EXPECT_EQ(m.Get("m1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.History("m1").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(m.identifier().Remembered("m1").empty());
  auto m2 = m.Get("m2");
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->turns, 1u);
  EXPECT_GT(m2->resident_tokens, 0);
  auto list = m.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id, "m2");
}

TEST_F(AgentManagerTest, InMemoryHistoryAndInfoAreBoundedLeastRecentlyUsedFirst) {
  AgentManagerOptions o;
  o.max_info_bytes = 1;            // room for the latest agent only
  o.max_memory_history_bytes = 1;  // the same for histories
  AgentManager m(nullptr, o);
  for (const char* id : {"m1", "m2", "m3"}) {
    auto t = m.NewTurn(id, Prompt(Tokens(8, 10)));
    AgentTurn::Start(t, [] {});
    Finish(*t, R"([{"role":"user","content":"x"}])", nullptr);
  }
  // The agent whose turn was recorded last is never dropped; the others'
  // histories (and what was known of them) are gone.
  EXPECT_EQ(m.History("m1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.History("m2").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(m.History("m3").ok());
  EXPECT_EQ(m.Get("m1").status().code(), StatusCode::kNotFound);
  auto list = m.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id, "m3");
  EXPECT_EQ((*list)[0].turns, 1u);
  EXPECT_FALSE(m.identifier().Remembered("m3").empty());
  EXPECT_TRUE(m.identifier().Remembered("m1").empty());
}

TEST_P(AgentManagerOnBothStores, InfoBoundKeepsStoreAgentsListedAndPagesByIdAfter) {
  AgentManagerOptions o;
  o.max_info_bytes = 1;
  std::unique_ptr<AgentManager> made = Make(o);
  AgentManager& m = *made;
  for (const char* id : {"s1", "s2", "s3"}) {
    auto t = m.NewTurn(id, Prompt(Tokens(8, 10)));
    AgentTurn::Start(t, [] {});
    Finish(*t, R"([{"role":"user","content":"x"}])", nullptr);
  }
  auto all = m.List();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);  // the store still has every agent
  auto s1 = m.Get("s1");
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(s1->turns, 1u);
  EXPECT_EQ(s1->resident_tokens, 0);  // what was known of its cache is gone
  EXPECT_GT(m.Get("s3")->resident_tokens, 0);
  auto page = m.List("", 2);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->agents.size(), 2u);
  EXPECT_EQ(page->agents[1].id, "s2");
  EXPECT_TRUE(page->has_more);
  page = m.List("s2", 2);
  ASSERT_EQ(page->agents.size(), 1u);
  EXPECT_EQ(page->agents[0].id, "s3");
  EXPECT_FALSE(page->has_more);
}

// A resume counts by its tier only when the agent's own context was served:
// a shared system prompt found in the pool is not the agent coming back.
TEST(ResumeSourceOfTest, CountsTheTierOnlyWhenMostOfTheAgentsContextWasCached) {
  using engine::CacheSource;
  // Turn 2 of an agent that held 640 tokens: 620 of 704 cached from the pool.
  EXPECT_EQ(ResumeSourceOf(620, 704, 640, CacheSource::kResident), CacheSource::kResident);
  // After a restart the same first prompt again: 32 shared tokens of 512.
  EXPECT_EQ(ResumeSourceOf(32, 512, 1044, CacheSource::kResident), CacheSource::kNone);
  // Half of the reusable part is enough; just under it is not.
  EXPECT_EQ(ResumeSourceOf(256, 512, 1044, CacheSource::kDisk), CacheSource::kDisk);
  EXPECT_EQ(ResumeSourceOf(255, 512, 1044, CacheSource::kDisk), CacheSource::kNone);
  // A shorter previous context bounds what could be reused.
  EXPECT_EQ(ResumeSourceOf(60, 2000, 100, CacheSource::kHost), CacheSource::kHost);
  // Unknown previous context (its info was forgotten): the prompt bounds it.
  EXPECT_EQ(ResumeSourceOf(300, 512, 0, CacheSource::kHost), CacheSource::kHost);
  EXPECT_EQ(ResumeSourceOf(0, 512, 0, CacheSource::kResident), CacheSource::kNone);
}

INSTANTIATE_TEST_SUITE_P(Stores, AgentManagerOnBothStores,
                         ::testing::Values(Kind::kLmdb, Kind::kMemory),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return info.param == Kind::kLmdb ? "Lmdb" : "Memory";
                         });

}  // namespace
}  // namespace agentkv::agent
