// Response formats and strict tool arguments: the request fields that ask
// for constrained decoding, compiled to a Grammar for
// SamplingParams::grammar (engine/grammar/json_schema.h has the supported
// JSON-schema subset; docs/structured-outputs.md the user's view).
//
//   response_format: {"type": "text"} (or absent, or null): no grammar;
//     {"type": "json_object"}: any JSON object;
//     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}:
//     the schema (strict or not: the output always follows it).
//
// Errors are InvalidArgument naming the field or the schema keyword.
// Pure apart from the model's vocabulary (built on first use); thread-safe.
#pragma once

#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/served_model.h"
#include "engine/grammar/grammar.h"
#include "util/status.h"

namespace agentkv::api {

// The grammar body["response_format"] asks for, or null for none.
// `raw_body` is the request text: parsed again keeping key order, so that a
// schema's properties come out in the order the client wrote them.
Result<std::shared_ptr<const Grammar>> ParseResponseFormat(std::string_view raw_body,
                                                           const nlohmann::json& body,
                                                           const ServedModel& model);

}  // namespace agentkv::api
