// HttpClient: one keep-alive HTTP/1.1 connection (plain TCP, Boost.Beast;
// blocking for the caller: each operation runs on the client's own
// io_context under the timeout) that posts a request and hands the
// response body to a callback
// piece by piece as it arrives, chunked or not, so a streamed reply can be
// timed event by event. Reconnects when the server closed the connection.
//
// Thread-safety: none; one client per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "workload.h"

namespace agentkv::loadgen {

struct Url {
  std::string host;
  uint16_t port = 80;
};

// "http://HOST[:PORT][/]"; nullopt for anything else (https is not
// supported: the generator measures the server, not TLS).
std::optional<Url> ParseUrl(const std::string& url);

class HttpClient {
 public:
  // `timeout_s`: the longest wait for any one read or write.
  HttpClient(Url url, double timeout_s);
  ~HttpClient();

  struct Response {
    int status = 0;     // 0: no response
    std::string error;  // the connection's error, if any
  };
  // Sends `call` as a POST and calls `on_body` with each piece of the body
  // as it is read.
  Response Post(const HttpCall& call, const std::function<void(std::string_view)>& on_body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentkv::loadgen
