// HttpClient against the project's own HttpServer on loopback: a streamed
// body arrives piece by piece, an error reply arrives whole, keep-alive
// reuses the connection and a server that stopped answering is a
// connection error after the timeout.
#include "http_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "api/http_server.h"

namespace agentkv::loadgen {
namespace {

// Streams "data: <i>\n\n" for i in 0..n-1, one event per wake.
class Counter : public api::AsyncBody {
 public:
  explicit Counter(int n) : n_(n) {}
  bool streaming() const override { return true; }
  void Start(std::function<void()> wake) override {
    thread_ = std::thread([this, wake] {
      for (int i = 0; i < n_; ++i) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ready_ += "data: " + std::to_string(i) + "\n\n";
          if (i == n_ - 1) finished_ = true;
        }
        wake();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  bool Poll(std::string* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    *out += ready_;
    ready_.clear();
    return finished_;
  }
  void Cancel() override {}
  ~Counter() override {
    if (thread_.joinable()) thread_.join();
  }

 private:
  int n_;
  std::mutex mu_;
  std::string ready_;
  bool finished_ = false;
  std::thread thread_;
};

TEST(HttpClientTest, ParsesUrls) {
  auto u = ParseUrl("http://127.0.0.1:8080");
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8080);
  u = ParseUrl("http://localhost/");
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->port, 80);
  u = ParseUrl("http://[::1]:9");
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->host, "::1");
  EXPECT_FALSE(ParseUrl("https://h:1").has_value());
  EXPECT_FALSE(ParseUrl("http://h:99999").has_value());
  EXPECT_FALSE(ParseUrl("http://h:1/v1").has_value());
}

TEST(HttpClientTest, StreamsPiecesAndKeepsTheConnection) {
  std::atomic<int> requests{0};
  api::HttpServerOptions so;
  so.port = 0;
  api::HttpServer server(so, [&](const api::HttpRequest& r) -> api::Reply {
    ++requests;
    if (r.path == "/bad") {
      api::HttpResponse resp;
      resp.status = 429;
      resp.body = R"({"error":"busy"})";
      return resp;
    }
    return std::unique_ptr<api::AsyncBody>(new Counter(20));
  });
  ASSERT_TRUE(server.Start().ok());
  HttpClient client({"127.0.0.1", server.port()}, 10);
  for (int round = 0; round < 2; ++round) {
    std::string body;
    int pieces = 0;
    auto r = client.Post({"/stream", "{}", {{"content-type", "application/json"}}},
                         [&](std::string_view d) {
                           body.append(d);
                           ++pieces;
                         });
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(body.substr(0, 9), "data: 0\n\n");
    EXPECT_NE(body.find("data: 19\n\n"), std::string::npos);
    EXPECT_GT(pieces, 1);  // not buffered until the end
    EXPECT_EQ(server.connections(), 1);
  }
  std::string body;
  auto r = client.Post({"/bad", "{}", {}}, [&](std::string_view d) { body.append(d); });
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(body, R"({"error":"busy"})");
  EXPECT_EQ(requests.load(), 3);
  const uint16_t port = server.port();
  server.Stop();
  // A server that no longer answers: the read gives up after the timeout.
  HttpClient late({"127.0.0.1", port}, 0.5);
  auto gone = late.Post({"/stream", "{}", {}}, [](std::string_view) {});
  EXPECT_EQ(gone.status, 0);
  EXPECT_FALSE(gone.error.empty());
}

}  // namespace
}  // namespace agentkv::loadgen
