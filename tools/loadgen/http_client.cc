#include "http_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>

namespace agentkv::loadgen {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

}  // namespace

std::optional<Url> ParseUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return std::nullopt;
  std::string rest = url.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.find('/') != std::string::npos) return std::nullopt;
  Url out;
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || rest.back() == ']') {
    out.host = rest;
    return out;
  }
  out.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const int p = std::stoi(port);
  if (p <= 0 || p > 65535 || out.host.empty()) return std::nullopt;
  out.port = static_cast<uint16_t>(p);
  if (out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

struct HttpClient::Impl {
  Url url;
  double timeout_s;
  net::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs one asynchronous operation to its end under the timeout (the
  // blocking calls of Asio wait forever).
  template <class Start>
  beast::error_code Run(Start start) {
    beast::error_code result;
    stream->expires_after(std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
    start([&result](beast::error_code ec, size_t) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  beast::error_code Connect() {
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    auto endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
    if (ec) return ec;
    stream.emplace(ioc);
    stream->expires_after(std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
    stream->async_connect(endpoints, [&ec](beast::error_code e, const tcp::endpoint&) { ec = e; });
    ioc.restart();
    ioc.run();
    if (ec) {
      stream.reset();
      return ec;
    }
    stream->socket().set_option(tcp::no_delay(true), ec);
    buffer.clear();
    return {};
  }

  void Drop() {
    if (!stream) return;
    beast::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream->close();
    stream.reset();
  }
};

HttpClient::HttpClient(Url url, double timeout_s) : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(url);
  impl_->timeout_s = timeout_s;
}

HttpClient::~HttpClient() { impl_->Drop(); }

HttpClient::Response HttpClient::Post(const HttpCall& call,
                                      const std::function<void(std::string_view)>& on_body) {
  Response out;
  http::request<http::string_body> req(http::verb::post, call.path, 11);
  req.set(http::field::host, impl_->url.host + ":" + std::to_string(impl_->url.port));
  req.set(http::field::user_agent, "agentkv-loadgen");
  for (const auto& [k, v] : call.headers) req.set(k, v);
  req.body() = call.body;
  req.keep_alive(true);
  req.prepare_payload();
  // A kept-alive connection the server closed fails on the write or on the
  // first read: then one retry on a fresh connection.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = impl_->stream.has_value();
    beast::error_code ec;
    if (!impl_->stream) ec = impl_->Connect();
    if (ec) {
      out.error = "connect: " + ec.message();
      return out;
    }
    ec = impl_->Run([&](auto done) { http::async_write(*impl_->stream, req, done); });
    if (ec) {
      impl_->Drop();
      if (reused) continue;
      out.error = "write: " + ec.message();
      return out;
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    // Chunk data goes to the callback as it is parsed, not into the body.
    auto on_chunk = [&on_body](std::uint64_t, beast::string_view data, beast::error_code&) {
      on_body(std::string_view(data.data(), data.size()));
      return data.size();
    };
    parser.on_chunk_body(on_chunk);
    ec = impl_->Run(
        [&](auto done) { http::async_read_header(*impl_->stream, impl_->buffer, parser, done); });
    if (ec) {
      impl_->Drop();
      if (reused && ec != beast::error::timeout) continue;
      out.error = "read: " + ec.message();
      return out;
    }
    out.status = parser.get().result_int();
    while (!parser.is_done()) {
      ec = impl_->Run(
          [&](auto done) { http::async_read_some(*impl_->stream, impl_->buffer, parser, done); });
      if (ec) break;
    }
    if (ec) {
      impl_->Drop();
      out.error = "read: " + ec.message();
      return out;
    }
    // A body that was not chunked (an error reply) arrives whole.
    if (!parser.chunked() && !parser.get().body().empty())
      on_body(std::string_view(parser.get().body()));
    if (!parser.get().keep_alive()) impl_->Drop();
    return out;
  }
  out.error = "the server closed the connection";
  return out;
}

}  // namespace agentkv::loadgen
