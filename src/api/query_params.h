// Request targets' parts: percent-decoding (path segments, query values)
// and lookup of one query-string parameter ("limit=10&after=a%20b").
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace agentkv::api {

// "a%20b" -> "a b"; malformed escapes stay as they are. With
// `plus_is_space` (query values, form encoding) '+' decodes to ' '.
std::string PercentDecode(std::string_view s, bool plus_is_space = false);

// The decoded value of the first `name=value` pair of `query`; "" for a
// bare `name` or `name=`; nullopt when absent.
std::optional<std::string> QueryParam(std::string_view query, std::string_view name);

}  // namespace agentkv::api
