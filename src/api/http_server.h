// HttpServer: a Boost.Beast HTTP/1.1 server. An acceptor hands each
// connection to a Session that runs on its own strand of a shared
// io_context served by a few threads: keep-alive, a read timeout for each
// request (headers and body), a body size limit per route (413, decided
// from the request line before the body is read), a connection limit (503
// past it), and a timeout on every write, so a client that stops reading
// cannot hold a connection, its generation or its blocks. Each request goes
// to the handler, which returns a complete response or an AsyncBody;
// streaming bodies go out as chunked Server-Sent-Events, written only as
// fast as the client reads (backpressure: the body is polled again once the
// previous chunk is on the wire), with a ": keep-alive" comment after each
// quiet interval. A client that disconnects or stalls past the write
// timeout gets its AsyncBody cancelled. With a certificate and key, every
// connection speaks TLS (handshake under the read timeout).
//
// Thread-safety: Start and Stop may be called from any thread; the handler
// is called concurrently from the io threads (and the offload executor's)
// and must be thread-safe and must not throw (the server turns escaping
// exceptions into 500s anyway).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/http_types.h"
#include "util/status.h"

namespace agentkv::api {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: any free port (see port())
  // I/O threads; 0: one per hardware thread, at least 2 and at most 8
  // (every streamed token is an SSE write on one of them).
  int threads = 0;
  uint64_t body_limit = 8ull << 20;
  // Per-route body limit from (method, path); null or 0: body_limit.
  std::function<uint64_t(const std::string& method, const std::string& path)> route_body_limit;
  // Open connections past which new ones are answered 503. Twice the
  // concurrency the server is built for (256 agents): a client that closes
  // a connection and opens the next one holds two until the server has seen
  // the close, so a limit equal to the client count refuses reconnects under
  // load (the soak test's 256 streaming clients got 503s on one in seven
  // requests with 256). Well under the usual 1024 open-file limit.
  int max_connections = 512;
  int read_timeout_s = 60;       // per request, headers and body
  int write_timeout_s = 30;      // per write (a response, an SSE chunk)
  int sse_keepalive_ms = 15000;  // quiet time before a ": keep-alive" comment
  // TLS (OpenSSL, TLS 1.2+): PEM certificate chain and private key. Both
  // empty: plain HTTP.
  std::string tls_cert_file, tls_key_file;
  // Requests for which `offload` returns true are handled on
  // `offload_executor` (a worker pool) and their reply comes back to the
  // connection: the io threads never run handlers that parse, render and
  // tokenize big bodies or wait for the store, so cheap requests (/health)
  // and running streams never wait behind them. Either null: every handler
  // runs on an io thread. The executor must run every task it is given
  // while the server lives (stop it before destroying the server).
  std::function<bool(const HttpRequest&)> offload;
  std::function<void(std::function<void()>)> offload_executor;
};

class HttpServer {
 public:
  using Handler = std::function<Reply(const HttpRequest&)>;

  HttpServer(HttpServerOptions options, Handler handler);
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads.
  Status Start();
  // Stops accepting new connections; open ones carry on.
  void StopAccepting();
  // Stops everything and joins the io threads.
  void Stop();

  uint16_t port() const { return port_; }
  // Connections open now.
  int connections() const;
  // The I/O threads of HttpServerOptions::threads = 0 on a machine with
  // `hardware_threads` (0 when unknown).
  static int DefaultThreads(unsigned hardware_threads);

  struct Impl;  // implementation detail, shared with the connections

 private:
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace agentkv::api
