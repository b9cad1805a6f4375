#include "api/http_server.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <exception>
#include <iostream>
#include <limits>
#include <optional>

namespace agentkv::api {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr size_t kHeaderLimit = 256 << 10;
// Bytes of pipelined requests kept while a reply is being produced; past
// it they are dropped and the connection closes after the reply (the
// client resends them), so the disconnect watch never stops reading.
constexpr size_t kPipelineLimit = 1 << 20;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string PlainError(const std::string& message) {
  // A protocol-neutral error body; adapters produce their own shapes.
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  return R"({"error":{"message":")" + escaped + R"(","type":"invalid_request_error"}})";
}

}  // namespace

struct HttpServer::Impl {
  // Declared before ioc: sessions still queued in ioc touch them while ioc
  // is destroyed.
  HttpServerOptions options;
  Handler handler;
  std::atomic<int> active{0};
  std::atomic<bool> stopped{false};
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::ssl::context> ssl_ctx;  // set: TLS on every connection
  std::vector<std::thread> threads;

  Impl(HttpServerOptions o, Handler h) : options(std::move(o)), handler(std::move(h)) {}
  void Accept();
};

namespace {

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

inline beast::tcp_stream MakeStream(tcp::socket&& s, HttpServer::Impl*, beast::tcp_stream*) {
  return beast::tcp_stream(std::move(s));
}
inline TlsStream MakeStream(tcp::socket&& s, HttpServer::Impl* server, TlsStream*) {
  return TlsStream(std::move(s), *server->ssl_ctx);
}

// One connection; Stream is beast::tcp_stream or TlsStream.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

 public:
  Session(tcp::socket socket, HttpServer::Impl* server, bool reject)
      : stream_(MakeStream(std::move(socket), server, static_cast<Stream*>(nullptr))),
        keepalive_(stream_.get_executor()),
        server_(server),
        reject_(reject) {
    ++server_->active;
  }
  ~Session() { --server_->active; }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->Lowest().expires_after(std::chrono::seconds(self->server_->options.read_timeout_s));
        self->stream_.async_handshake(net::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) return self->Close();
          self->Begin();
        });
      } else {
        self->Begin();
      }
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Begin() {
    if (reject_) {
      HttpResponse r;
      r.status = 503;
      r.body = PlainError("too many connections");
      keep_alive_ = false;
      return WriteResponse(std::move(r));
    }
    DoRead();
  }

  void DoRead() {
    parser_.emplace();
    // The route's limit is set once the request line is known (OnHeader).
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    parser_->header_limit(kHeaderLimit);
    Lowest().expires_after(std::chrono::seconds(server_->options.read_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Sets the route's body limit, then reads the body (same deadline).
  void OnHeader(beast::error_code ec) {
    if (ec) return OnRead(ec);
    uint64_t limit = server_->options.body_limit;
    if (server_->options.route_body_limit) {
      const auto& msg = parser_->get();
      std::string target(msg.target());
      target = target.substr(0, target.find('?'));
      const uint64_t route =
          server_->options.route_body_limit(std::string(msg.method_string()), target);
      if (route > 0) limit = route;
    }
    parser_->body_limit(limit);
    if (const auto len = parser_->content_length(); len && *len > limit) {
      return OnRead(http::error::body_limit);
    }
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void ArmWrite() {
    last_write_ = std::chrono::steady_clock::now();
    Lowest().expires_after(std::chrono::seconds(server_->options.write_timeout_s));
  }

  // While a stream is quiet, a comment every sse_keepalive_ms keeps proxies
  // and clients from timing out.
  void ArmKeepAlive() {
    if (server_->options.sse_keepalive_ms <= 0) return;
    const auto interval = std::chrono::milliseconds(server_->options.sse_keepalive_ms);
    keepalive_.expires_at(last_write_ + interval);
    keepalive_.async_wait([self = this->shared_from_this(), interval](beast::error_code ec) {
      if (ec || !self->body_ || self->closed_) return;
      if (!self->writing_ && std::chrono::steady_clock::now() - self->last_write_ >= interval) {
        self->out_ = ": keep-alive\n\n";
        self->writing_ = true;
        self->body_done_ = false;
        self->ArmWrite();
        net::async_write(self->stream_, http::make_chunk(net::buffer(self->out_)),
                         [self](beast::error_code ec, size_t) { self->OnBodyWrite(ec); });
      }
      self->ArmKeepAlive();
    });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::eof) {
      return Close();
    }
    if (ec) {
      HttpResponse r;
      r.status = ec == http::error::body_limit ? 413 : 400;
      r.body = PlainError(r.status == 413 ? "request body too large" : ec.message());
      keep_alive_ = false;
      return WriteResponse(std::move(r));
    }
    auto& msg = parser_->get();
    keep_alive_ = msg.keep_alive();
    version_ = msg.version();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    head_ = msg.method() == http::verb::head;
    const std::string target(msg.target());
    const size_t q = target.find('?');
    req.path = target.substr(0, q);
    if (q != std::string::npos) req.query = target.substr(q + 1);
    for (const auto& f : msg)
      req.headers[Lower(std::string(f.name_string()))] = std::string(f.value());
    req.body = std::move(msg.body());
    parser_.reset();

    const auto& o = server_->options;
    if (o.offload && o.offload_executor && o.offload(req)) {
      // Handled on the executor; the reply comes back to this strand.
      auto self = this->shared_from_this();
      auto shared_req = std::make_shared<HttpRequest>(std::move(req));
      auto ex = stream_.get_executor();
      o.offload_executor([self, shared_req, ex] {
        auto reply = std::make_shared<Reply>(self->CallHandler(*shared_req));
        net::post(ex, [self, reply] { self->OnReply(std::move(*reply)); });
      });
      return;
    }
    OnReply(CallHandler(req));
  }

  Reply CallHandler(const HttpRequest& req) {
    Reply reply;
    try {
      reply = server_->handler(req);
    } catch (const std::exception& e) {
      // The text may quote the request or files the server read: the log
      // gets it, the client does not.
      std::cerr << "internal error on " << req.method << " " << req.path << ": " << e.what()
                << "\n";
      HttpResponse r;
      r.status = 500;
      r.body = PlainError("internal error");
      reply = std::move(r);
    } catch (...) {
      HttpResponse r;
      r.status = 500;
      r.body = PlainError("internal error");
      reply = std::move(r);
    }
    return reply;
  }

  void OnReply(Reply reply) {
    if (closed_) {
      // The server stopped the connection meanwhile: the work is not wanted.
      if (auto* b = std::get_if<std::unique_ptr<AsyncBody>>(&reply); b && *b) (*b)->Cancel();
      return;
    }
    if (auto* r = std::get_if<HttpResponse>(&reply)) return WriteResponse(std::move(*r));
    body_ = std::move(std::get<std::unique_ptr<AsyncBody>>(reply));
    body_done_ = false;
    pending_.clear();
    Lowest().expires_never();
    StartWatch();
    if (body_->streaming()) {
      auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
      res->set(http::field::server, "agentkv");
      res->set(http::field::content_type, "text/event-stream");
      res->set(http::field::cache_control, "no-cache");
      res->keep_alive(keep_alive_);
      res->chunked(true);
      auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
      writing_ = true;
      ArmWrite();
      ArmKeepAlive();
      http::async_write_header(
          stream_, *sr, [self = this->shared_from_this(), res, sr](beast::error_code ec, size_t) {
            self->OnBodyWrite(ec);
          });
    }
    std::weak_ptr<Session> weak = this->shared_from_this();
    auto ex = stream_.get_executor();
    try {
      body_->Start([weak, ex] {
        net::post(ex, [weak] {
          if (auto s = weak.lock()) s->Pump();
        });
      });
    } catch (...) {
      // Start must not throw; if it does, the body is treated as cancelled.
      body_->Cancel();
      body_.reset();
      return Close();
    }
  }

  // Waits for the client to close while a body is being produced.
  void StartWatch() {
    watching_ = true;
    auto on_read = [self = this->shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (!ec) {
        self->buffer_.commit(n);  // a pipelined request; read it later
        if (self->resume_after_watch_) return self->AfterBody();
        if (self->buffer_.size() > kPipelineLimit) {
          self->buffer_.consume(self->buffer_.size());
          self->keep_alive_ = false;
        }
        // Still producing: keep watching, or a disconnect after a
        // pipelined byte would go unnoticed.
        if (self->body_ && !self->closed_) self->StartWatch();
        return;
      }
      if (self->resume_after_watch_ && ec == net::error::operation_aborted) {
        return self->AfterBody();
      }
      self->ClientGone();
    };
    // TLS: through the TLS layer (a read of the raw socket would eat TLS
    // records); plain: the socket itself, outside the stream's timeouts.
    if constexpr (kTls) {
      stream_.async_read_some(buffer_.prepare(4096), std::move(on_read));
    } else {
      Lowest().socket().async_read_some(buffer_.prepare(4096), std::move(on_read));
    }
  }

  void ClientGone() {
    keepalive_.cancel();
    if (body_) {
      body_->Cancel();
      body_.reset();
    }
    Close();
  }

  // Moves whatever the body has ready onto the wire.
  void Pump() {
    if (!body_ || writing_ || closed_) return;
    bool done = false;
    try {
      done = body_->Poll(&pending_);
    } catch (const std::exception& e) {
      std::cerr << "internal error while producing a reply: " << e.what() << "\n";
      return FailBody();
    } catch (...) {
      return FailBody();
    }
    if (body_->streaming()) {
      if (!pending_.empty()) {
        out_ = std::move(pending_);
        pending_.clear();
        writing_ = true;
        body_done_ = done;
        ArmWrite();
        net::async_write(stream_, http::make_chunk(net::buffer(out_)),
                         [self = this->shared_from_this()](beast::error_code ec, size_t) {
                           self->OnBodyWrite(ec);
                         });
        return;
      }
      if (done) return FinishStream();
      return;
    }
    if (!done) return;
    HttpResponse r;
    r.status = body_->status();
    r.content_type = body_->content_type();
    r.body = std::move(pending_);
    pending_.clear();
    body_.reset();
    WriteResponse(std::move(r));
  }

  // The body failed while producing its reply: what it produced so far is
  // not sent. A plain reply becomes a 500; a stream whose 200 header is out
  // already is cut off without its last chunk, which clients see as a
  // broken response rather than a complete one.
  void FailBody() {
    const bool streaming = body_->streaming();
    try {
      body_->Cancel();
    } catch (...) {
    }
    body_.reset();
    pending_.clear();
    if (streaming) {
      keep_alive_ = false;
      return Close();
    }
    HttpResponse r;
    r.status = 500;
    r.body = PlainError("internal error");
    WriteResponse(std::move(r));
  }

  void OnBodyWrite(beast::error_code ec) {
    writing_ = false;
    Lowest().expires_never();
    if (ec) return ClientGone();
    if (body_done_) return FinishStream();
    Pump();
  }

  void FinishStream() {
    body_.reset();
    keepalive_.cancel();
    writing_ = true;
    ArmWrite();
    net::async_write(stream_, http::make_chunk_last(),
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       self->Lowest().expires_never();
                       if (ec) return self->Close();
                       self->Resume();
                     });
  }

  void WriteResponse(HttpResponse r) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), version_ ? version_ : 11);
    res->set(http::field::server, "agentkv");
    res->set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->keep_alive(keep_alive_);
    if (head_) {
      res->content_length(0);
    } else {
      res->body() = std::move(r.body);
      res->prepare_payload();
    }
    writing_ = true;
    ArmWrite();
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        self->Lowest().expires_never();
                        if (ec) return self->Close();
                        self->Resume();
                      });
  }

  // A response is complete: read the next request, or close.
  void Resume() {
    if (!keep_alive_ || server_->stopped) return Close();
    if (watching_) {
      resume_after_watch_ = true;
      beast::error_code ignored;
      Lowest().socket().cancel(ignored);
      return;
    }
    DoRead();
  }

  void AfterBody() {
    resume_after_watch_ = false;
    if (!keep_alive_ || server_->stopped) return Close();
    DoRead();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    keepalive_.cancel();
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Lowest().socket().close(ignored);
  }

  Stream stream_;
  net::steady_timer keepalive_;
  std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
  beast::flat_buffer buffer_;
  HttpServer::Impl* server_;
  bool reject_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::unique_ptr<AsyncBody> body_;
  std::string pending_, out_;
  unsigned version_ = 11;
  bool keep_alive_ = true, head_ = false;
  bool writing_ = false, body_done_ = false, closed_ = false;
  bool watching_ = false, resume_after_watch_ = false;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (stopped || !acceptor->is_open()) return;
      return Accept();
    }
    const bool reject = active.load() >= options.max_connections;
    if (ssl_ctx) {
      std::make_shared<Session<TlsStream>>(std::move(socket), this, reject)->Run();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(std::move(socket), this, reject)->Run();
    }
    Accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  beast::error_code ec;
  if (!impl_->options.tls_cert_file.empty() || !impl_->options.tls_key_file.empty()) {
    if (impl_->options.tls_cert_file.empty() || impl_->options.tls_key_file.empty()) {
      return InvalidArgument("TLS needs both a certificate and a key file");
    }
    auto& ctx = impl_->ssl_ctx.emplace(net::ssl::context::tls_server);
    ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                    net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                    net::ssl::context::no_tlsv1_1);
    ctx.use_certificate_chain_file(impl_->options.tls_cert_file, ec);
    if (ec) {
      impl_->ssl_ctx.reset();
      return InvalidArgument("TLS certificate " + impl_->options.tls_cert_file + ": " +
                             ec.message());
    }
    ctx.use_private_key_file(impl_->options.tls_key_file, net::ssl::context::pem, ec);
    if (ec) {
      impl_->ssl_ctx.reset();
      return InvalidArgument("TLS key " + impl_->options.tls_key_file + ": " + ec.message());
    }
  }
  auto addr = net::ip::make_address(impl_->options.host, ec);
  if (ec) return InvalidArgument("bad host '" + impl_->options.host + "': " + ec.message());
  tcp::endpoint ep(addr, impl_->options.port);
  auto& acc = impl_->acceptor.emplace(net::make_strand(impl_->ioc));
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return IoError("cannot listen on " + impl_->options.host + ":" +
                   std::to_string(impl_->options.port) + ": " + ec.message());
  }
  port_ = acc.local_endpoint().port();
  impl_->Accept();
  const int n = impl_->options.threads > 0
                    ? impl_->options.threads
                    : HttpServer::DefaultThreads(std::thread::hardware_concurrency());
  for (int i = 0; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  return Status::Ok();
}

void HttpServer::StopAccepting() {
  if (!impl_->acceptor) return;
  net::post(impl_->acceptor->get_executor(), [this] {
    beast::error_code ignored;
    impl_->acceptor->close(ignored);
  });
}

void HttpServer::Stop() {
  if (!impl_ || impl_->stopped.exchange(true)) return;
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

int HttpServer::connections() const { return impl_->active.load(); }

int HttpServer::DefaultThreads(unsigned hardware_threads) {
  return std::clamp(static_cast<int>(hardware_threads), 2, 8);
}

}  // namespace agentkv::api
