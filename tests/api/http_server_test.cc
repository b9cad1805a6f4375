// HttpServer without a model: keep-alive, HEAD, body limit (413),
// connection limit (503), handler exceptions (500), streaming bodies and
// cancellation when the client disconnects.
#include "api/http_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "util/task_pool.h"

namespace agentkv::api {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// Streams "data: n\n\n" events whenever the test calls Emit; finishes on
// Finish.
class FakeStream : public AsyncBody {
 public:
  explicit FakeStream(std::atomic<int>* cancelled) : cancelled_(cancelled) {}
  bool streaming() const override { return true; }
  void Start(std::function<void()> wake) override {
    std::lock_guard<std::mutex> l(mu_);
    wake_ = std::move(wake);
    // Emit one event right away.
    pending_ += "data: first\n\n";
    wake_();
  }
  bool Poll(std::string* out) override {
    std::lock_guard<std::mutex> l(mu_);
    *out += pending_;
    pending_.clear();
    return false;  // never finishes by itself
  }
  void Cancel() override { ++*cancelled_; }

 private:
  std::atomic<int>* cancelled_;
  std::mutex mu_;
  std::function<void()> wake_;
  std::string pending_;
};

class Finite : public AsyncBody {
 public:
  explicit Finite(bool stream) : stream_(stream) {}
  bool streaming() const override { return stream_; }
  void Start(std::function<void()> wake) override { wake(); }
  bool Poll(std::string* out) override {
    *out += stream_ ? "data: one\n\ndata: [DONE]\n\n" : "{\"ok\":true}";
    return true;
  }
  void Cancel() override {}

 private:
  bool stream_;
};

// Never finishes; hands out 256 KiB every time it is polled (the server
// polls again once the previous chunk is on the wire).
class Flood : public AsyncBody {
 public:
  explicit Flood(std::atomic<int>* cancelled) : cancelled_(cancelled) {}
  bool streaming() const override { return true; }
  void Start(std::function<void()> wake) override { wake(); }
  bool Poll(std::string* out) override {
    out->append(256 << 10, 'x');
    return false;
  }
  void Cancel() override { ++*cancelled_; }

 private:
  std::atomic<int>* cancelled_;
};

// Produces part of its reply, then throws.
class ThrowingPoll : public AsyncBody {
 public:
  ThrowingPoll(bool stream, std::atomic<int>* cancelled) : stream_(stream), cancelled_(cancelled) {}
  bool streaming() const override { return stream_; }
  void Start(std::function<void()> wake) override { wake(); }
  bool Poll(std::string* out) override {
    *out += stream_ ? "data: part\n\n" : "{\"partial\":";
    throw std::runtime_error("poll boom");
  }
  void Cancel() override { ++*cancelled_; }

 private:
  bool stream_;
  std::atomic<int>* cancelled_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(int max_connections = 8,
                   const std::function<void(HttpServerOptions*)>& tweak = nullptr) {
    HttpServerOptions o;
    o.port = 0;
    o.max_connections = max_connections;
    o.body_limit = 1024;
    if (tweak) tweak(&o);
    server_ = std::make_unique<HttpServer>(o, [this](const HttpRequest& r) -> Reply {
      if (r.path == "/throw") throw std::runtime_error("boom");
      if (r.path == "/slow") {
        std::unique_lock<std::mutex> l(slow_mu_);
        slow_cv_.wait(l, [&] { return slow_released_; });
      }
      if (r.path == "/stream") return std::unique_ptr<AsyncBody>(new FakeStream(&cancelled_));
      if (r.path == "/flood") return std::unique_ptr<AsyncBody>(new Flood(&cancelled_));
      if (r.path == "/finite") return std::unique_ptr<AsyncBody>(new Finite(true));
      if (r.path == "/later") return std::unique_ptr<AsyncBody>(new Finite(false));
      if (r.path == "/pollthrow")
        return std::unique_ptr<AsyncBody>(new ThrowingPoll(false, &cancelled_));
      if (r.path == "/pollthrow-stream")
        return std::unique_ptr<AsyncBody>(new ThrowingPoll(true, &cancelled_));
      HttpResponse res;
      res.body = "{\"path\":\"" + r.path + "\",\"query\":\"" + r.query +
                 "\",\"len\":" + std::to_string(r.body.size()) + "}";
      return res;
    });
    ASSERT_TRUE(server_->Start().ok());
  }

  tcp::socket Connect() {
    tcp::socket s(io_);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
    return s;
  }

  // Reads until `needle` is seen or the peer closes.
  static std::string ReadUntil(tcp::socket& s, const std::string& needle) {
    std::string got;
    char buf[4096];
    boost::system::error_code ec;
    while (got.find(needle) == std::string::npos) {
      const size_t n = s.read_some(net::buffer(buf), ec);
      if (ec) break;
      got.append(buf, n);
    }
    return got;
  }

  void ReleaseSlow() {
    std::lock_guard<std::mutex> l(slow_mu_);
    slow_released_ = true;
    slow_cv_.notify_all();
  }

  net::io_context io_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> cancelled_{0};
  std::mutex slow_mu_;
  std::condition_variable slow_cv_;
  bool slow_released_ = false;
};

TEST_F(HttpServerTest, KeepAliveServesSeveralRequests) {
  StartServer();
  tcp::socket s = Connect();
  for (int i = 0; i < 3; ++i) {
    net::write(s, net::buffer(std::string("GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n")));
    const std::string r = ReadUntil(s, "}");
    EXPECT_NE(r.find("200 OK"), std::string::npos) << r;
    EXPECT_NE(r.find("\"query\":\"x=1\""), std::string::npos) << r;
  }
  net::write(s, net::buffer(std::string("HEAD / HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string head = ReadUntil(s, "\r\n\r\n");
  EXPECT_NE(head.find("Content-Length: 0"), std::string::npos) << head;
}

TEST_F(HttpServerTest, BodyLimitIs413AndExceptionsAre500) {
  StartServer();
  {
    tcp::socket s = Connect();
    const std::string body(4096, 'x');
    net::write(s,
               net::buffer("POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 4096\r\n\r\n" + body));
    EXPECT_NE(ReadUntil(s, "}}").find("413"), std::string::npos);
  }
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /throw HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string r = ReadUntil(s, "}}");
  EXPECT_NE(r.find("500"), std::string::npos) << r;
  EXPECT_NE(r.find("internal error"), std::string::npos) << r;
  EXPECT_EQ(r.find("boom"), std::string::npos) << r;  // the exception's text stays in the log
}

TEST_F(HttpServerTest, ConnectionLimitIs503) {
  StartServer(/*max_connections=*/1);
  tcp::socket first = Connect();
  net::write(first, net::buffer(std::string("GET /a HTTP/1.1\r\nHost: h\r\n\r\n")));
  ReadUntil(first, "}");  // the first connection is surely accepted now
  tcp::socket second = Connect();
  const std::string r = ReadUntil(second, "}}");
  EXPECT_NE(r.find("503"), std::string::npos) << r;
}

// 256 clients that each hold a connection and reconnect after every reply
// briefly hold more than 256: the default limit must leave room for that.
TEST_F(HttpServerTest, DefaultLimitServes256ClientsWhileTheyReconnect) {
  StartServer(HttpServerOptions().max_connections);
  std::vector<tcp::socket> held;
  for (int i = 0; i < 256; ++i) {
    held.push_back(Connect());
    net::write(held.back(), net::buffer(std::string("GET /a HTTP/1.1\r\nHost: h\r\n\r\n")));
    ASSERT_NE(ReadUntil(held.back(), "}").find("200 OK"), std::string::npos) << i;
  }
  // Each client opens its next connection before the old one is gone.
  for (int i = 0; i < 64; ++i) {
    tcp::socket next = Connect();
    net::write(next, net::buffer(std::string("GET /b HTTP/1.1\r\nHost: h\r\n\r\n")));
    const std::string r = ReadUntil(next, "}");
    ASSERT_NE(r.find("200 OK"), std::string::npos) << i << ": " << r;
    held[i] = std::move(next);
  }
}

TEST_F(HttpServerTest, StreamsAndFinishesAsyncBodies) {
  StartServer();
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /finite HTTP/1.1\r\nHost: h\r\n\r\n")));
  std::string r = ReadUntil(s, "0\r\n\r\n");
  EXPECT_NE(r.find("text/event-stream"), std::string::npos) << r;
  EXPECT_NE(r.find("data: [DONE]"), std::string::npos) << r;
  // The connection stays usable after a stream.
  net::write(s, net::buffer(std::string("GET /later HTTP/1.1\r\nHost: h\r\n\r\n")));
  r = ReadUntil(s, "{\"ok\":true}");
  EXPECT_NE(r.find("{\"ok\":true}"), std::string::npos) << r;
}

TEST_F(HttpServerTest, ClientDisconnectCancelsTheBody) {
  StartServer();
  {
    tcp::socket s = Connect();
    net::write(s, net::buffer(std::string("GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")));
    const std::string r = ReadUntil(s, "data: first");
    ASSERT_NE(r.find("data: first"), std::string::npos) << r;
  }  // closes the socket mid-stream
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cancelled_.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(cancelled_.load(), 1);
}

TEST_F(HttpServerTest, DisconnectAfterAPipelinedByteStillCancelsTheBody) {
  StartServer();
  {
    tcp::socket s = Connect();
    // One byte of a next request arrives while the stream runs.
    net::write(s, net::buffer(std::string("GET /stream HTTP/1.1\r\nHost: h\r\n\r\nG")));
    const std::string r = ReadUntil(s, "data: first");
    ASSERT_NE(r.find("data: first"), std::string::npos) << r;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cancelled_.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(cancelled_.load(), 1);
}

TEST_F(HttpServerTest, PipelinedRequestIsServedAfterAStream) {
  StartServer();
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /finite HTTP/1.1\r\nHost: h\r\n\r\n"
                                        "GET /later HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string r = ReadUntil(s, "{\"ok\":true}");
  EXPECT_NE(r.find("data: [DONE]"), std::string::npos) << r;
  EXPECT_NE(r.find("{\"ok\":true}"), std::string::npos) << r;
}

TEST_F(HttpServerTest, ThrowingPollIs500NotAPartial200) {
  StartServer();
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /pollthrow HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string r = ReadUntil(s, "}}");
  EXPECT_NE(r.find("500"), std::string::npos) << r;
  EXPECT_EQ(r.find("200 OK"), std::string::npos) << r;
  EXPECT_EQ(r.find("partial"), std::string::npos) << r;
  EXPECT_EQ(r.find("poll boom"), std::string::npos) << r;
  EXPECT_EQ(cancelled_.load(), 1);
}

TEST_F(HttpServerTest, ThrowingPollCutsAStreamWithoutItsLastChunk) {
  StartServer();
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /pollthrow-stream HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string r = ReadUntil(s, "never sent");        // until the server closes
  EXPECT_EQ(r.find("0\r\n\r\n"), std::string::npos) << r;  // not a complete stream
  EXPECT_EQ(r.find("data: part"), std::string::npos) << r;
  EXPECT_EQ(cancelled_.load(), 1);
}

TEST_F(HttpServerTest, OffloadedHandlersNeverHoldTheIoThread) {
  TaskPool pool(2, "offload");
  StartServer(8, [&](HttpServerOptions* o) {
    o->threads = 1;  // one io thread: a handler blocking on it would stall everything
    o->offload = [](const HttpRequest& r) { return r.path != "/a"; };
    o->offload_executor = [&pool](std::function<void()> f) { pool.Post(std::move(f)); };
  });
  tcp::socket slow = Connect();
  net::write(slow, net::buffer(std::string("GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")));
  // Should the handler hold the io thread after all, this lets it go after
  // a while so the test fails instead of hanging.
  std::thread watchdog([this] {
    std::unique_lock<std::mutex> l(slow_mu_);
    slow_cv_.wait_for(l, std::chrono::seconds(10), [&] { return slow_released_; });
    slow_released_ = true;
    slow_cv_.notify_all();
  });
  tcp::socket quick = Connect();
  net::write(quick, net::buffer(std::string("GET /a HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string a = ReadUntil(quick, "}");
  bool answered_while_slow_ran;
  {
    std::lock_guard<std::mutex> l(slow_mu_);
    answered_while_slow_ran = !slow_released_;
  }
  EXPECT_TRUE(answered_while_slow_ran);
  EXPECT_NE(a.find("\"path\":\"/a\""), std::string::npos) << a;
  // An offloaded stream works as any other.
  net::write(quick, net::buffer(std::string("GET /finite HTTP/1.1\r\nHost: h\r\n\r\n")));
  EXPECT_NE(ReadUntil(quick, "0\r\n\r\n").find("data: [DONE]"), std::string::npos);
  ReleaseSlow();
  EXPECT_NE(ReadUntil(slow, "}").find("\"path\":\"/slow\""), std::string::npos);
  watchdog.join();
  server_->Stop();
  pool.Stop();
}

TEST_F(HttpServerTest, BodyLimitsPerRoute) {
  StartServer(8, [](HttpServerOptions* o) {
    o->route_body_limit = [](const std::string& method, const std::string& path) -> uint64_t {
      return method == "POST" && path == "/big" ? 8192 : 0;
    };
  });
  const std::string body(4096, 'x');
  tcp::socket s = Connect();
  net::write(
      s, net::buffer("POST /big?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 4096\r\n\r\n" + body));
  std::string r = ReadUntil(s, "}");
  EXPECT_NE(r.find("200 OK"), std::string::npos) << r;
  EXPECT_NE(r.find("\"len\":4096"), std::string::npos) << r;
  tcp::socket t = Connect();
  net::write(t,
             net::buffer("POST /small HTTP/1.1\r\nHost: h\r\nContent-Length: 4096\r\n\r\n" + body));
  r = ReadUntil(t, "}}");
  EXPECT_NE(r.find("413"), std::string::npos) << r;
  // Chunked bodies (no Content-Length) are held to the limit as they come.
  tcp::socket u = Connect();
  std::string chunked = "POST /small HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 4; ++i) chunked += "400\r\n" + std::string(1024, 'y') + "\r\n";
  chunked += "0\r\n\r\n";
  boost::system::error_code ec;
  net::write(u, net::buffer(chunked), ec);
  r = ReadUntil(u, "}}");
  EXPECT_NE(r.find("413"), std::string::npos) << r;
}

TEST_F(HttpServerTest, StalledReaderIsCancelledByTheWriteTimeout) {
  StartServer(8, [](HttpServerOptions* o) { o->write_timeout_s = 1; });
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /flood HTTP/1.1\r\nHost: h\r\n\r\n")));
  // Never read: the kernel buffers fill, the write stalls and times out.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(10);
  while (cancelled_.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(cancelled_.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The connection is gone.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server_->connections() > 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->connections(), 0);
}

TEST_F(HttpServerTest, QuietStreamsGetKeepAliveComments) {
  StartServer(8, [](HttpServerOptions* o) { o->sse_keepalive_ms = 100; });
  tcp::socket s = Connect();
  net::write(s, net::buffer(std::string("GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")));
  const std::string r = ReadUntil(s, ": keep-alive\n\n");
  EXPECT_NE(r.find("data: first"), std::string::npos) << r;
  EXPECT_NE(r.find(": keep-alive\n\n"), std::string::npos) << r;
  EXPECT_EQ(cancelled_.load(), 0);
}

TEST_F(HttpServerTest, ServesTlsWithASelfSignedCertificate) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "agentkv_tls_XXXXXX").string();
  const fs::path dir = ::mkdtemp(tmpl.data());
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-keyout '" +
      key + "' -out '" + cert + "' > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "the openssl command is missing";
  StartServer(8, [&](HttpServerOptions* o) {
    o->tls_cert_file = cert;
    o->tls_key_file = key;
  });
  net::ssl::context ctx(net::ssl::context::tls_client);
  ctx.load_verify_file(cert);  // trust exactly the test's certificate
  net::ssl::stream<tcp::socket> tls(io_, ctx);
  tls.set_verify_mode(net::ssl::verify_peer);
  tls.next_layer().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_->port()));
  tls.handshake(net::ssl::stream_base::client);
  // Keep-alive and a streamed body over TLS.
  for (const char* path : {"/a", "/finite"}) {
    net::write(tls, net::buffer("GET " + std::string(path) + " HTTP/1.1\r\nHost: h\r\n\r\n"));
    std::string got;
    char buf[4096];
    boost::system::error_code ec;
    const std::string end = std::string(path) == "/a" ? "}" : "0\r\n\r\n";
    while (got.find(end) == std::string::npos) {
      const size_t n = tls.read_some(net::buffer(buf), ec);
      if (ec) break;
      got.append(buf, n);
    }
    EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
    if (std::string(path) == "/finite") {
      EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
    }
  }
  // A plain-HTTP client gets no answer, and the server stays up.
  tcp::socket plain = Connect();
  net::write(plain, net::buffer(std::string("GET /a HTTP/1.1\r\nHost: h\r\n\r\n")));
  EXPECT_EQ(ReadUntil(plain, "}").find("200 OK"), std::string::npos);
  fs::remove_all(dir);
}

TEST(HttpServerThreadsTest, DefaultIsOnePerCoreFromTwoToEight) {
  EXPECT_EQ(HttpServer::DefaultThreads(0), 2);  // unknown
  EXPECT_EQ(HttpServer::DefaultThreads(1), 2);
  EXPECT_EQ(HttpServer::DefaultThreads(6), 6);
  EXPECT_EQ(HttpServer::DefaultThreads(16), 8);
}

TEST_F(HttpServerTest, TlsNeedsReadableCertificateAndKey) {
  HttpServerOptions o;
  o.port = 0;
  o.tls_cert_file = "/no/such/cert.pem";
  o.tls_key_file = "/no/such/key.pem";
  HttpServer s(o, [](const HttpRequest&) -> Reply { return HttpResponse{}; });
  EXPECT_EQ(s.Start().code(), StatusCode::kInvalidArgument);
  o.tls_key_file.clear();
  HttpServer t(o, [](const HttpRequest&) -> Reply { return HttpResponse{}; });
  EXPECT_EQ(t.Start().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace agentkv::api
