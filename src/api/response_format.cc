#include "api/response_format.h"

#include "engine/grammar/json_schema.h"

namespace agentkv::api {

Result<std::shared_ptr<const Grammar>> ParseResponseFormat(std::string_view raw_body,
                                                           const nlohmann::json& body,
                                                           const ServedModel& model) {
  if (!body.contains("response_format") || body["response_format"].is_null())
    return std::shared_ptr<const Grammar>();
  const nlohmann::json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return InvalidArgument("'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::shared_ptr<const Grammar>();
  if (type == "json_object") {
    auto g = CompileAnyJsonObject(model.grammar_vocab());
    if (!g.ok()) return g.status().WithContext("response_format");
    return *g;
  }
  if (type != "json_schema")
    return InvalidArgument("'response_format.type' must be text, json_object or json_schema");
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    return InvalidArgument("'response_format.json_schema' must be an object");
  const nlohmann::json& js = rf["json_schema"];
  if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
    return InvalidArgument("'response_format.json_schema.strict' must be a boolean");
  if (js.contains("name") && !js["name"].is_null() && !js["name"].is_string())
    return InvalidArgument("'response_format.json_schema.name' must be a string");
  if (!js.contains("schema") || js["schema"].is_null())
    return InvalidArgument("'response_format.json_schema.schema' is required");
  // The same request again, keeping the schema's key order.
  const auto ordered = nlohmann::ordered_json::parse(raw_body, nullptr, false);
  nlohmann::ordered_json schema;
  if (!ordered.is_discarded() && ordered.is_object())
    schema = ordered["response_format"]["json_schema"]["schema"];
  else
    schema = nlohmann::ordered_json(js["schema"]);
  auto g = CompileJsonSchema(schema, model.grammar_vocab());
  if (!g.ok()) return g.status().WithContext("response_format.json_schema.schema");
  return *g;
}

}  // namespace agentkv::api
