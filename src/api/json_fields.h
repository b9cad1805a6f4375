// Optional fields of request bodies, read without exceptions: an absent or
// null field is the default, a field of another type is InvalidArgument
// naming it (`where` prefixes the name: "messages[].type"). nlohmann's
// value() throws on null and on mistyped fields, which became 500s.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "util/status.h"

namespace agentkv::api {

Result<std::string> OptionalString(const nlohmann::json& object, const char* key,
                                   std::string_view where, std::string fallback = "");
Result<bool> OptionalBool(const nlohmann::json& object, const char* key, std::string_view where,
                          bool fallback = false);
// The field itself, or `fallback` (a JSON value) when absent or null.
nlohmann::json OptionalValue(const nlohmann::json& object, const char* key,
                             nlohmann::json fallback);

}  // namespace agentkv::api
