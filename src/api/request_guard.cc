#include "api/request_guard.h"

#include <algorithm>
#include <cctype>

namespace agentkv::api {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsDottedLoopback(std::string_view h) {
  // 127.a.b.c with each part a decimal 0..255.
  int parts = 0;
  size_t at = 0;
  while (at <= h.size()) {
    size_t end = h.find('.', at);
    if (end == std::string_view::npos) end = h.size();
    const std::string_view p = h.substr(at, end - at);
    if (p.empty() || p.size() > 3 ||
        !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    const int v = std::stoi(std::string(p));
    if (v > 255 || (parts == 0 && v != 127)) return false;
    ++parts;
    at = end + 1;
  }
  return parts == 4;
}

}  // namespace

std::string_view HostWithoutPort(std::string_view host_header) {
  std::string_view h = Trim(host_header);
  if (!h.empty() && h.front() == '[') {
    const size_t close = h.find(']');
    return close == std::string_view::npos ? h : h.substr(0, close + 1);
  }
  const size_t colon = h.find(':');
  // More than one colon: a bare IPv6 address (no port possible).
  if (colon != std::string_view::npos && h.find(':', colon + 1) == std::string_view::npos)
    return h.substr(0, colon);
  return h;
}

bool IsLoopbackName(std::string_view host) {
  const std::string h = Lower(host);
  if (h == "localhost" || h == "::1" || h == "[::1]") return true;
  constexpr std::string_view kLocal = ".localhost";
  if (h.size() > kLocal.size() && h.compare(h.size() - kLocal.size(), kLocal.size(), kLocal) == 0)
    return true;
  return IsDottedLoopback(h);
}

GuardVerdict CheckRequest(const HttpRequest& req, const RequestGuardOptions& o) {
  if ((req.method == "GET" && req.path == "/health") || (req.method == "HEAD" && req.path == "/"))
    return {};
  const auto origin_it = req.headers.find("origin");
  if (origin_it != req.headers.end()) {
    const std::string origin = Lower(Trim(origin_it->second));
    const bool allowed =
        std::any_of(o.allowed_origins.begin(), o.allowed_origins.end(),
                    [&](const std::string& a) { return a == "*" || Lower(a) == origin; });
    if (!allowed) {
      return {403, "requests from web pages (Origin " + origin_it->second +
                       ") are refused; allow the origin with --allow-origin"};
    }
  }
  if (o.loopback) {
    const auto host_it = req.headers.find("host");
    if (host_it != req.headers.end()) {
      const std::string_view name = HostWithoutPort(host_it->second);
      const std::string lower = Lower(name);
      const bool allowed = IsLoopbackName(name) ||
                           std::any_of(o.allowed_hosts.begin(), o.allowed_hosts.end(),
                                       [&](const std::string& a) { return Lower(a) == lower; });
      if (!allowed) {
        return {403, "Host '" + std::string(name) +
                         "' is not a loopback name; this server listens on loopback only "
                         "(accept it with --allow-host)"};
      }
    }
  }
  if (req.method == "POST") {
    const std::string header = req.Header("content-type");
    std::string_view type = header;
    type = Trim(type.substr(0, type.find(';')));
    if (Lower(type) != "application/json") {
      return {415, "POST bodies must be sent as Content-Type: application/json"};
    }
  }
  return {};
}

}  // namespace agentkv::api
