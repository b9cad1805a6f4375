// End-to-end: starts `agentkv serve` on the default model and runs the
// official OpenAI and Anthropic npm clients against it (tests/api/clients.cjs),
// then checks that SIGTERM drains and exits 0. Skipped when node or the npm
// packages are missing.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
};

// Starts the server with stdout on a pipe; stderr stays the test's.
Child StartServer() {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    const std::string model = std::string(AGENTKV_DATA_DIR) + "/models/default";
    char store[] = "/tmp/agentkv-server-test-XXXXXX";
    if (mkdtemp(store) == nullptr) _exit(126);
    execl(AGENTKV_BINARY, AGENTKV_BINARY, "serve", "--model", model.c_str(), "--port", "0",
          "--threads", "1", "--store", store, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

// Reads the child's stdout until "listening on http://HOST:PORT"; returns
// the port, or -1 after `timeout_s`.
int WaitListening(int fd, int timeout_s, std::string* seen) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[256];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return -1;
    seen->append(buf, static_cast<size_t>(n));
    const size_t at = seen->find("listening on http://");
    const size_t nl = at == std::string::npos ? at : seen->find('\n', at);
    if (nl != std::string::npos) {
      const size_t colon = seen->rfind(':', nl);
      return std::stoi(seen->substr(colon + 1, nl - colon - 1));
    }
  }
  return -1;
}

std::string RunShell(const std::string& cmd, int* status) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  *status = pclose(f);
  return out;
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
  Child c = StartServer();
  ASSERT_GT(c.pid, 0);
  std::string seen;
  const int port = WaitListening(c.out_fd, 60, &seen);
  if (port <= 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    FAIL() << "server did not start; stdout: " << seen;
  }

  const std::string script = std::string(AGENTKV_SOURCE_DIR) + "/tests/api/clients.cjs";
  const std::string out = RunShell(
      "timeout 60 node '" + script + "' " + std::to_string(port) + " '" + npm.string() + "' 2>&1",
      &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("ALL OK"), std::string::npos) << out;

  // SIGTERM: drain and exit 0.
  kill(c.pid, SIGTERM);
  int wstatus = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pid_t r = 0;
  while ((r = waitpid(c.pid, &wstatus, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    usleep(50 * 1000);
  }
  if (r == 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &wstatus, 0);
    FAIL() << "server did not exit after SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  close(c.out_fd);
}

}  // namespace
