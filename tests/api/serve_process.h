// ServeProcess: `agentkv serve` as a child process, for the end-to-end tests
// that drive it with the official npm clients. Its stdout goes to a pipe the
// test reads for the "listening on" line; stderr stays the test's (ctest
// shows it when a test fails).
//
// Not thread-safe: one test thread owns a ServeProcess.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace agentkv::testing {

// Runs `cmd` through the shell; its stdout, with its exit status in *status
// (-1 when it could not be started).
inline std::string RunShell(const std::string& cmd, int* status) {
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

class ServeProcess {
 public:
  ServeProcess() = default;
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  // A server still running is killed (a test that failed before Stop).
  ~ServeProcess() { Kill(); }

  // Starts `agentkv serve ARGS...`; false if it could not be forked.
  bool Start(const std::vector<std::string>& args) {
    Kill();
    int fds[2];
    if (pipe(fds) != 0) return false;
    std::vector<std::string> argv = {AGENTKV_BINARY, "serve"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(AGENTKV_BINARY, cargv.data());
      _exit(127);
    }
    close(fds[1]);
    if (pid_ < 0) {
      close(fds[0]);
      return false;
    }
    out_fd_ = fds[0];
    return true;
  }

  // Reads stdout until "listening on http(s)://HOST:PORT"; the port, or -1
  // after `timeout_s` (the server is then killed).
  int WaitListening(int timeout_s = 60) {
    std::string seen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (out_fd_ >= 0 && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out_fd_, buf, sizeof(buf));
      if (n <= 0) break;
      seen.append(buf, static_cast<size_t>(n));
      const size_t at = seen.find("listening on http");
      const size_t nl = at == std::string::npos ? at : seen.find('\n', at);
      if (nl != std::string::npos) {
        const size_t colon = seen.rfind(':', nl);
        return std::stoi(seen.substr(colon + 1, nl - colon - 1));
      }
    }
    Kill();
    return -1;
  }

  // Start, then WaitListening: the port, or -1.
  int StartListening(const std::vector<std::string>& args) {
    return Start(args) ? WaitListening() : -1;
  }

  // Sends SIGTERM and waits for the drain; true when the server exited 0
  // within `timeout_s` (its own drain deadline is 30 s). A server that did
  // not exit has every thread's stack printed (gdb is on the test machines)
  // and is killed.
  bool Stop(int timeout_s = 60) {
    if (pid_ <= 0) return false;
    kill(pid_, SIGTERM);
    int wstatus = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    pid_t r = 0;
    while ((r = waitpid(pid_, &wstatus, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      usleep(20 * 1000);
    }
    if (r == 0) {
      int st = 0;
      std::cerr << RunShell("timeout 60 gdb -p " + std::to_string(pid_) +
                                " -batch -ex 'thread apply all bt' 2>&1 | grep -v '^\\[New LWP'",
                            &st)
                << "\n";
      Kill();
      return false;
    }
    pid_ = -1;
    CloseOut();
    return WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  }

  // Waits for the server to exit on its own (a refused start); its wait
  // status.
  int WaitExit() {
    int wstatus = 0;
    if (pid_ > 0) waitpid(pid_, &wstatus, 0);
    pid_ = -1;
    CloseOut();
    return wstatus;
  }

  // SIGKILL (no drain) and reap; nothing if not running.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    CloseOut();
  }

  pid_t pid() const { return pid_; }

 private:
  void CloseOut() {
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
};

}  // namespace agentkv::testing
