// RequestGuard: what keeps web pages from driving a local server. A server on
// 127.0.0.1 without an API key is reachable by every page the user's browser
// opens: a page can POST a text/plain body without a CORS preflight, and a
// DNS-rebinding page can make its own name resolve to 127.0.0.1 and read the
// answers. So:
//   - a POST must say `Content-Type: application/json` (415 otherwise): a
//     browser sends that type cross-origin only after a preflight, which
//     this server never grants;
//   - a request with an `Origin` header not in the allowed list is refused
//     (403): browsers send it on cross-origin requests, other clients don't;
//   - a server listening on a loopback address refuses a `Host` that is not
//     a loopback name or one it was told to accept (403): a rebinding page's
//     requests carry its own name.
// GET /health and HEAD / are exempt (monitoring; they reveal nothing).
//
// Thread-safety: pure functions over an immutable options struct.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "api/http_types.h"

namespace agentkv::api {

struct RequestGuardOptions {
  // The server listens on a loopback address only: Host is checked.
  bool loopback = true;
  // Origins allowed (exact "scheme://host[:port]", or "*" for any).
  std::vector<std::string> allowed_origins;
  // Host names accepted besides the loopback ones (without a port).
  std::vector<std::string> allowed_hosts;
};

struct GuardVerdict {
  int status = 0;  // 0: the request may go on; else 403 or 415
  std::string message;
};

GuardVerdict CheckRequest(const HttpRequest& req, const RequestGuardOptions& options);

// "localhost", "foo.localhost", "127.0.0.1" .. "127.255.255.255", "::1" and
// "[::1]" (case-insensitive; no port).
bool IsLoopbackName(std::string_view host);
// The host part of a Host header value: "[::1]:8080" -> "[::1]",
// "example.com:80" -> "example.com".
std::string_view HostWithoutPort(std::string_view host_header);

}  // namespace agentkv::api
