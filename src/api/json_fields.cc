#include "api/json_fields.h"

namespace agentkv::api {
namespace {

std::string Name(std::string_view where, const char* key) {
  return where.empty() ? std::string(key) : std::string(where) + "." + key;
}

const nlohmann::json* Field(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

Result<std::string> OptionalString(const nlohmann::json& object, const char* key,
                                   std::string_view where, std::string fallback) {
  const nlohmann::json* f = Field(object, key);
  if (f == nullptr) return fallback;
  if (!f->is_string()) return InvalidArgument(Name(where, key) + ": must be a string");
  return f->get<std::string>();
}

Result<bool> OptionalBool(const nlohmann::json& object, const char* key, std::string_view where,
                          bool fallback) {
  const nlohmann::json* f = Field(object, key);
  if (f == nullptr) return fallback;
  if (!f->is_boolean()) return InvalidArgument(Name(where, key) + ": must be a boolean");
  return f->get<bool>();
}

nlohmann::json OptionalValue(const nlohmann::json& object, const char* key,
                             nlohmann::json fallback) {
  const nlohmann::json* f = Field(object, key);
  return f == nullptr ? fallback : *f;
}

}  // namespace agentkv::api
