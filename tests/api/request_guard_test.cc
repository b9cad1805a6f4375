#include "api/request_guard.h"

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

HttpRequest Req(std::string method, std::string path,
                std::map<std::string, std::string> headers = {}) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.headers = std::move(headers);
  return r;
}

TEST(RequestGuardTest, LoopbackNames) {
  for (const char* h : {"localhost", "LOCALHOST", "app.localhost", "127.0.0.1", "127.1.2.3",
                        "127.255.255.255", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackName(h)) << h;
  }
  for (const char* h : {"", "example.com", "localhost.example.com", "128.0.0.1", "127.0.0",
                        "127.0.0.256", "0.0.0.0", "10.0.0.1", "127.0.0.1.evil.com", "[::2]"}) {
    EXPECT_FALSE(IsLoopbackName(h)) << h;
  }
  EXPECT_EQ(HostWithoutPort("localhost:8080"), "localhost");
  EXPECT_EQ(HostWithoutPort("[::1]:8080"), "[::1]");
  EXPECT_EQ(HostWithoutPort("::1"), "::1");
  EXPECT_EQ(HostWithoutPort(" example.com "), "example.com");
}

TEST(RequestGuardTest, PostsNeedJson) {
  RequestGuardOptions o;
  EXPECT_EQ(CheckRequest(Req("POST", "/v1/chat/completions"), o).status, 415);
  EXPECT_EQ(CheckRequest(Req("POST", "/v1/messages", {{"content-type", "text/plain"}}), o).status,
            415);
  EXPECT_EQ(
      CheckRequest(
          Req("POST", "/v1/messages", {{"content-type", "application/x-www-form-urlencoded"}}), o)
          .status,
      415);
  EXPECT_EQ(
      CheckRequest(Req("POST", "/v1/messages", {{"content-type", "application/json"}}), o).status,
      0);
  EXPECT_EQ(
      CheckRequest(
          Req("POST", "/v1/messages", {{"content-type", "Application/JSON; charset=utf-8"}}), o)
          .status,
      0);
  // GETs and DELETEs carry no body.
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents"), o).status, 0);
  EXPECT_EQ(CheckRequest(Req("DELETE", "/v1/agents/a"), o).status, 0);
}

TEST(RequestGuardTest, ForeignOriginsAreRefusedUnlessAllowed) {
  RequestGuardOptions o;
  const std::map<std::string, std::string> h = {{"origin", "https://evil.example"},
                                                {"content-type", "application/json"}};
  EXPECT_EQ(CheckRequest(Req("POST", "/v1/chat/completions", h), o).status, 403);
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", h), o).status, 403);
  // Even a local page's origin: only what is allowed gets through.
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", {{"origin", "http://localhost:3000"}}), o).status,
            403);
  o.allowed_origins = {"https://Evil.Example"};
  EXPECT_EQ(CheckRequest(Req("POST", "/v1/chat/completions", h), o).status, 0);
  o.allowed_origins = {"*"};
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", {{"origin", "null"}}), o).status, 0);
}

TEST(RequestGuardTest, LoopbackServersRefuseForeignHosts) {
  RequestGuardOptions o;  // loopback
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", {{"host", "127.0.0.1:8080"}}), o).status, 0);
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", {{"host", "localhost"}}), o).status, 0);
  // A DNS-rebinding page's requests name its own host.
  EXPECT_EQ(
      CheckRequest(Req("GET", "/v1/agents", {{"host", "rebind.evil.example:8080"}}), o).status,
      403);
  o.allowed_hosts = {"box.lan"};
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", {{"host", "BOX.lan:8080"}}), o).status, 0);
  // Listening beyond loopback, Host names are not known in advance.
  RequestGuardOptions open;
  open.loopback = false;
  EXPECT_EQ(CheckRequest(Req("GET", "/v1/agents", {{"host", "anything.example"}}), open).status, 0);
}

TEST(RequestGuardTest, HealthChecksAreExempt) {
  RequestGuardOptions o;
  const std::map<std::string, std::string> h = {{"origin", "https://evil.example"},
                                                {"host", "evil.example"}};
  EXPECT_EQ(CheckRequest(Req("GET", "/health", h), o).status, 0);
  EXPECT_EQ(CheckRequest(Req("HEAD", "/", h), o).status, 0);
}

}  // namespace
}  // namespace agentkv::api
