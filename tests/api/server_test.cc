// End-to-end: starts `agentkv serve` on the default model and runs the
// official OpenAI and Anthropic npm clients against it (tests/api/clients.cjs),
// then checks that SIGTERM drains and exits 0. Skipped when node or the npm
// packages are missing.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "serve_process.h"

namespace {

namespace fs = std::filesystem;

std::string MakeTempDir() {
  char tmpl[] = "/tmp/agentkv-server-test-XXXXXX";
  return mkdtemp(tmpl) ? std::string(tmpl) : std::string();
}

using agentkv::testing::RunShell;
using agentkv::testing::ServeProcess;

// `agentkv serve` on the default model and `store`, one compute thread.
std::vector<std::string> ServeArgs(const std::string& store, std::vector<std::string> extra = {}) {
  const std::string model = std::string(AGENTKV_DATA_DIR) + "/models/default";
  std::vector<std::string> args = {"--model",   model, "--port",  "0",
                                   "--threads", "1",   "--store", store};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The agent-layer scenarios of tests/api/agents.cjs, each against its own
// server (fresh store unless given).
class AgentsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    npm_ = fs::path(AGENTKV_SOURCE_DIR) / "tools/npm";
    int st = 0;
    RunShell("node --version > /dev/null 2>&1", &st);
    if (st != 0) GTEST_SKIP() << "node is not installed";
    if (!fs::exists(npm_ / "node_modules/openai")) GTEST_SKIP() << "npm packages missing";
    if (!fs::exists(fs::path(AGENTKV_DATA_DIR) / "models/default/config.json")) {
      GTEST_SKIP() << "default model missing";
    }
    store_ = MakeTempDir();
  }
  void TearDown() override {
    if (!store_.empty()) fs::remove_all(store_);
  }

  // Starts a server on `store_`; the port, or -1.
  int Start(ServeProcess* c, std::vector<std::string> extra = {}) {
    return c->StartListening(ServeArgs(store_, std::move(extra)));
  }

  // Runs a scenario; its output, with *ok set when it printed ALL OK.
  std::string Scenario(const std::string& name, int port, const std::string& args, bool* ok,
                       const std::string& env = "") {
    const std::string script = std::string(AGENTKV_SOURCE_DIR) + "/tests/api/" + script_;
    int st = 0;
    const std::string out =
        RunShell(env + " timeout 120 node '" + script + "' " + name + " " + std::to_string(port) +
                     " '" + npm_.string() + "' " + args + " 2>&1",
                 &st);
    *ok = st == 0 && out.find("ALL OK") != std::string::npos;
    return out;
  }

  // A server started with `flags` runs scenario `name` and stops cleanly.
  void RunOnItsOwnServer(const std::string& name, std::vector<std::string> flags = {},
                         const std::string& args = "", const std::string& env = "") {
    ServeProcess c;
    const int port = Start(&c, std::move(flags));
    ASSERT_GT(port, 0);
    bool ok = false;
    const std::string out = Scenario(name, port, args, &ok, env);
    EXPECT_TRUE(ok) << out;
    EXPECT_TRUE(c.Stop());
  }

  fs::path npm_;
  std::string store_;
  std::string script_ = "agents.cjs";  // under tests/api
};

// The decoding scenarios of tests/api/decoding.cjs (logprobs, n > 1).
class DecodingE2eTest : public AgentsE2eTest {
 protected:
  DecodingE2eTest() { script_ = "decoding.cjs"; }
};

TEST_F(DecodingE2eTest, LogprobsHaveOpenAisShapes) { RunOnItsOwnServer("logprobs"); }

// Greedy steps' logprobs against log-softmax of `agentkv logits` (1e-3).
TEST_F(DecodingE2eTest, LogprobsAreLogSoftmaxOfTheLogits) {
  const std::string model = std::string(AGENTKV_DATA_DIR) + "/models/default";
  RunOnItsOwnServer("logits", {}, std::string("'") + AGENTKV_BINARY + "' '" + model + "'");
}

TEST_F(DecodingE2eTest, SeveralChoicesShareThePrompt) { RunOnItsOwnServer("choices"); }

TEST_F(AgentsE2eTest, ConcurrentTurnsOfOneAgentRunInOrder) { RunOnItsOwnServer("order"); }

TEST_F(AgentsE2eTest, WrongApiKeyIs401InEachProtocolsShape) {
  RunOnItsOwnServer("apikey", {"--api-key", "sekret"}, "sekret");
}

TEST_F(AgentsE2eTest, ServesHttpsWithTlsFlags) {
  const std::string cert = store_ + "/cert.pem", key = store_ + "/key.pem";
  int st = 0;
  RunShell(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -addext "
      "subjectAltName=IP:127.0.0.1 -keyout '" +
          key + "' -out '" + cert + "' > /dev/null 2>&1",
      &st);
  if (st != 0) GTEST_SKIP() << "the openssl command is missing";
  RunOnItsOwnServer("tls", {"--tls-cert", cert, "--tls-key", key}, "",
                    "AGENTKV_TEST_TLS=1 NODE_EXTRA_CA_CERTS='" + cert + "'");
}

TEST_F(AgentsE2eTest, SixteenAgentsShareABatch) { RunOnItsOwnServer("parallel"); }

TEST_F(AgentsE2eTest, ClientDisconnectReleasesBlocks) { RunOnItsOwnServer("disconnect"); }

TEST_F(AgentsE2eTest, AgentResumesFromDiskAfterRestart) {
  ServeProcess c;
  int port = Start(&c);
  ASSERT_GT(port, 0);
  bool ok = false;
  std::string out = Scenario("restart1", port, "", &ok);
  EXPECT_TRUE(ok) << out;
  ASSERT_TRUE(c.Stop());  // SIGTERM flushes the KV to the store
  port = Start(&c);
  ASSERT_GT(port, 0);
  out = Scenario("restart2", port, "", &ok);
  EXPECT_TRUE(ok) << out;
  EXPECT_TRUE(c.Stop());
}

TEST_F(AgentsE2eTest, HotSwapAndBack) {
  // Swaps load only from --models-dir: a copy of the default model (same
  // fingerprint) and a second, smaller model with the same tokenizer.
  const std::string models = store_ + "/models";
  const std::string model_a = models + "/a";
  const std::string other = models + "/b";
  fs::create_directories(model_a);
  std::error_code ec;
  fs::copy(fs::path(AGENTKV_DATA_DIR) / "models/default", model_a,
           fs::copy_options::recursive | fs::copy_options::create_hard_links, ec);
  if (ec)
    fs::copy(fs::path(AGENTKV_DATA_DIR) / "models/default", model_a, fs::copy_options::recursive);
  int st = 0;
  const std::string synth =
      RunShell(std::string(AGENTKV_BINARY) + " model synth --arch qwen3 --tokenizer '" +
                   AGENTKV_DATA_DIR + "/tokenizers/qwen3' --out '" + other +
                   "' --layers 2 --hidden 64 --heads 2 --kv-heads 1 "
                   "--seed 7 2>&1",
               &st);
  ASSERT_EQ(st, 0) << synth;
  RunOnItsOwnServer("swap", {"--models-dir", models}, "'" + model_a + "' '" + other + "'");
}

// GET `path` with `key` (x-api-key; none when empty) over a fresh
// connection; the response's status, or -1.
int StatusOfGet(int port, const std::string& path, const std::string& key) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!key.empty()) req += "x-api-key: " + key + "\r\n";
  req += "\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return -1;
  }
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  close(fd);
  if (got.rfind("HTTP/1.1 ", 0) != 0 || got.size() < 12) return -1;
  return std::stoi(got.substr(9, 3));
}

// Signals arriving while the server reloads its keys (or starts) are
// handled in turn, never by a library's thread that does not block them (its
// default action would end the process without draining).
TEST(ServeTest, SignalsInABurstAreAllHandled) {
  if (!fs::exists(fs::path(AGENTKV_DATA_DIR) / "models/default/config.json")) {
    GTEST_SKIP() << "default model missing";
  }
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{dir};
  const std::string keys = dir + "/keys";
  {
    FILE* f = fopen(keys.c_str(), "w");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < 2000; ++i) fprintf(f, "key-%016d tenant%d\n", i, i % 7);
    fclose(f);
  }
  ServeProcess c;
  const int port = c.StartListening(ServeArgs(dir + "/store", {"--api-keys", keys}));
  ASSERT_GT(port, 0) << "server did not start";
  for (int i = 0; i < 200; ++i) kill(c.pid(), SIGHUP);
  usleep(200 * 1000);
  EXPECT_EQ(StatusOfGet(port, "/health", ""), 200);
  EXPECT_EQ(StatusOfGet(port, "/v1/agents", "key-0000000000000003"), 200);
  EXPECT_TRUE(c.Stop());  // drained, exit 0
}

TEST(ServeTest, ApiKeysFileIsReloadedOnSighup) {
  if (!fs::exists(fs::path(AGENTKV_DATA_DIR) / "models/default/config.json")) {
    GTEST_SKIP() << "default model missing";
  }
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{dir};
  const std::string keys = dir + "/keys";
  auto write_keys = [&](const std::string& text) {
    FILE* f = fopen(keys.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(text.c_str(), f);
    fclose(f);
  };
  write_keys("alice-key-0123456789 alice\n");
  // --api-key and --api-keys together are refused.
  {
    ServeProcess bad;
    ASSERT_TRUE(bad.Start(ServeArgs(dir + "/store", {"--api-keys", keys, "--api-key", "x"})));
    const int wstatus = bad.WaitExit();
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 2);
  }
  ServeProcess c;
  const int port = c.StartListening(ServeArgs(dir + "/store", {"--api-keys", keys}));
  ASSERT_GT(port, 0) << "server did not start";
  EXPECT_EQ(StatusOfGet(port, "/v1/agents", "alice-key-0123456789"), 200);
  EXPECT_EQ(StatusOfGet(port, "/v1/agents", "bob-key-0123456789"), 401);
  EXPECT_EQ(StatusOfGet(port, "/v1/agents", ""), 401);
  EXPECT_EQ(StatusOfGet(port, "/health", ""), 200);

  write_keys("bob-key-0123456789 bob\n");
  kill(c.pid(), SIGHUP);
  int bob = 0;
  for (int i = 0; i < 500 && (bob = StatusOfGet(port, "/v1/agents", "bob-key-0123456789")) != 200;
       ++i) {
    usleep(20 * 1000);
  }
  EXPECT_EQ(bob, 200);
  EXPECT_EQ(StatusOfGet(port, "/v1/agents", "alice-key-0123456789"), 401);
  // A file that does not load keeps the keys in force.
  write_keys("short bob\n");
  kill(c.pid(), SIGHUP);
  usleep(200 * 1000);
  EXPECT_EQ(StatusOfGet(port, "/v1/agents", "bob-key-0123456789"), 200);
  EXPECT_TRUE(c.Stop());
}

TEST(ServeTest, OfficialClientsAgainstServer) {
  const fs::path npm = fs::path(AGENTKV_SOURCE_DIR) / "tools/npm";
  int st = 0;
  RunShell("node --version > /dev/null 2>&1", &st);
  if (st != 0) GTEST_SKIP() << "node is not installed";
  if (!fs::exists(npm / "node_modules/openai") ||
      !fs::exists(npm / "node_modules/@anthropic-ai/sdk")) {
    GTEST_SKIP() << "npm packages missing: run `cd tools/npm && npm install`";
  }
  const std::string store = MakeTempDir();
  ASSERT_FALSE(store.empty());
  struct Cleanup {
    std::string dir;
    ~Cleanup() { fs::remove_all(dir); }
  } cleanup{store};
  ServeProcess c;
  const int port = c.StartListening(ServeArgs(store));
  ASSERT_GT(port, 0) << "server did not start";

  const std::string script = std::string(AGENTKV_SOURCE_DIR) + "/tests/api/clients.cjs";
  const std::string out = RunShell(
      "timeout 60 node '" + script + "' " + std::to_string(port) + " '" + npm.string() + "' 2>&1",
      &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("ALL OK"), std::string::npos) << out;

  // SIGTERM: drain and exit 0.
  EXPECT_TRUE(c.Stop());
}

}  // namespace
