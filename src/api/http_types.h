// Plain types shared by the HTTP server and the protocol adapters: a parsed
// request, a complete response, and AsyncBody, a response produced later
// (a generation) either whole or as a Server-Sent-Events stream.
//
// Thread-safety: HttpRequest / HttpResponse are values. An AsyncBody is
// driven by one connection's strand: Start, Poll and Cancel are called there,
// one at a time; only the `wake` callback it is given may run elsewhere.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>

namespace agentkv::api {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // target without the query string
  std::string query;                           // after '?', may be empty
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  // Set by the API service once the key is checked, never from the wire:
  // the tenant of the key (--api-keys; "" without tenants) and whether it
  // may ask for high priority.
  std::string tenant;
  bool high_priority_allowed = true;

  // The header's value, or "" when absent. `name` must be lower case.
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;  // extra headers
};

// A response whose body comes from work running elsewhere (the engine).
class AsyncBody {
 public:
  virtual ~AsyncBody() = default;
  // True: the body is an event stream sent as it comes (status 200,
  // text/event-stream); false: Poll returns the whole body when done.
  virtual bool streaming() const = 0;
  // Begins the work. `wake` may be called from any thread, any number of
  // times, and must not block; the server answers each by calling Poll on
  // the connection's strand.
  virtual void Start(std::function<void()> wake) = 0;
  // Appends the bytes ready now to `out`; returns true once the body is
  // complete (nothing more will come).
  virtual bool Poll(std::string* out) = 0;
  // Status and content type of a non-streaming body; valid once Poll
  // returned true.
  virtual int status() const { return 200; }
  virtual std::string content_type() const { return "application/json"; }
  // The client went away: stop the work. Poll is not called afterwards.
  virtual void Cancel() = 0;
};

// What a handler returns: a response now, or one that comes later.
using Reply = std::variant<HttpResponse, std::unique_ptr<AsyncBody>>;

}  // namespace agentkv::api
