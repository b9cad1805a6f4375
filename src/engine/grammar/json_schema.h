// CompileJsonSchema: a JSON schema (the subset docs/structured-outputs.md
// lists) compiled to a Grammar whose matches are exactly JSON texts the
// schema accepts, written compactly or with bounded whitespace.
//
// Subset: `type` (one or a list), `properties` / `required` /
// `additionalProperties` (true or false), `items` / `minItems` /
// `maxItems`, `enum`, `const`, strings' `pattern` (json_regex.h) or
// `minLength` / `maxLength`, integers' `minimum` / `maximum` /
// `exclusiveMinimum` / `exclusiveMaximum` (exact, within int64), numbers'
// inclusive integer-valued `minimum` / `maximum` (exact), `anyOf`,
// `$ref` to "#", "#/$defs/..." or "#/definitions/...", plus annotations
// (title, description, default, examples, $schema, $id, $comment). Any other
// keyword, or a supported one used in a way outside the subset, is
// InvalidArgument naming it.
//
// Generation choices (each output still validates): properties come in
// the schema's order, optional ones may be left out; an object with
// `properties` gets only those properties (even without
// `additionalProperties: false`); an object schema without `properties`
// takes any JSON object (or only {} with `additionalProperties: false`).
// Up to kMaxWhitespace bytes of whitespace may stand between tokens of
// JSON structure; none before or after the value.
//
// Bounds: the schema text at most kMaxSchemaBytes, nesting at most
// kMaxSchemaDepth, counts (minItems, maxLength, ...) at most kMaxUnroll,
// the grammar's node limit, and recursion (through $ref or any nested JSON
// value) at most GrammarLimits::max_stack_depth nested calls.
//
// Pure; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar.h"
#include "util/status.h"

namespace agentkv::grammar {

inline constexpr size_t kMaxSchemaBytes = 256 * 1024;
inline constexpr int kMaxSchemaDepth = 32;
inline constexpr int64_t kMaxUnroll = 1024;
inline constexpr int32_t kMaxWhitespace = 8;

// The ordered form keeps the schema's property order (the output's order).
Result<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarLimits limits = {});
// Properties in alphabetical order (nlohmann::json sorts keys).
Result<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::json& schema, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarLimits limits = {});
// Tool calls in a model's own tool-call syntax (the formats of
// engine/text/output/tool_call_parser.h), the arguments following each
// tool's `parameters` schema (or, with !constrain_arguments, any object).
enum class ToolCallSyntax { kHermes, kLlama31Json, kGemmaFenced };
struct ToolGrammarSpec {
  std::string name;
  nlohmann::ordered_json parameters;
  bool constrain_arguments = true;
};
struct ToolGrammarOptions {
  ToolCallSyntax syntax = ToolCallSyntax::kHermes;
  // true: the output is exactly one call (tool_choice required / a named
  // tool / Anthropic any / tool); false: text without the call marker, with
  // any number of calls between (Hermes and fenced syntaxes only).
  bool required = true;
  // The prompt ends inside <think>: any reasoning text and </think> first.
  bool starts_in_reasoning = false;
};
Result<std::shared_ptr<const Grammar>> CompileToolCallGrammar(
    const std::vector<ToolGrammarSpec>& tools, const ToolGrammarOptions& options,
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits = {});

// Any JSON object (OpenAI's response_format {"type": "json_object"}).
Result<std::shared_ptr<const Grammar>> CompileAnyJsonObject(
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits = {});

}  // namespace agentkv::grammar
