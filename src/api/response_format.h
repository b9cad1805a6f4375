// Response formats and strict tool arguments: the request fields that ask
// for constrained decoding, compiled to a Grammar for
// SamplingParams::grammar (engine/grammar/json_schema.h has the supported
// JSON-schema subset; docs/structured-outputs.md the user's view).
//
//   response_format: {"type": "text"} (or absent, or null): no grammar;
//     {"type": "json_object"}: any JSON object;
//     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}:
//     the schema (strict or not: the output always follows it).
// For a harmony model (gpt_oss) the grammar is the final channel's content,
// reasoning allowed before it (engine/grammar/harmony_grammar.h). For a
// model that thinks in a <think> block (qwen3), given the rendered chat
// prompt, the block is allowed before the structured reply where the
// prompt leaves thinking on (WithThinkingBlock).
//
// Errors are InvalidArgument naming the field or the schema keyword.
// Pure apart from the model's vocabulary (built on first use); thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/served_model.h"
#include "engine/grammar/grammar.h"
#include "util/status.h"

namespace agentkv::api {

// The grammar body["response_format"] asks for, or null for none. `chat`:
// the output is a chat reply (the prompt from the chat template), which a
// harmony model writes in its message format; false for raw completions.
// `raw_body` is the request text: parsed again keeping key order, so that a
// schema's properties come out in the order the client wrote them.
// `prompt_text`: the rendered chat prompt (chat only; null: not known, no
// reasoning block added).
Result<std::shared_ptr<const grammar::Grammar>> ParseResponseFormat(
    std::string_view raw_body, const nlohmann::json& body, const ServedModel& model, bool chat,
    const std::string* prompt_text = nullptr);

// Tool calls constrained to the model's tool-call syntax (Hermes for qwen2
// and qwen3, Llama 3.1 JSON for llama, fenced blocks for gemma3, harmony
// commentary messages to functions.NAME for gpt_oss). `tools`
// in OpenAI's shape ({"type": "function", "function": {"name",
// "parameters", "strict"}}), as the chat template gets them.
//   OpenAI: tool_choice "required" or {"type": "function", "function":
//     {"name"}}: exactly one call (of that tool), arguments following the
//     schema where the function has "strict": true (else any object);
//     "auto" (or absent) with a strict function: text and calls, the strict
//     functions' arguments following their schemas; otherwise null.
//   Anthropic: tool_choice {"type": "any"} or {"type": "tool", "name"}:
//     exactly one call, arguments always following input_schema; otherwise
//     null.
// A required call (not `auto`, whose reply is free text around the calls)
// gets the reasoning block before it as ParseResponseFormat, given
// `prompt_text`.
// InvalidArgument naming tool_choice or the schema keyword; for a model
// family without a supported syntax when a constraint is asked.
enum class ToolProtocol { kOpenAi, kAnthropic };
Result<std::shared_ptr<const grammar::Grammar>> ToolCallGrammar(
    ToolProtocol protocol, const nlohmann::ordered_json& tools, const nlohmann::json& body,
    const ServedModel& model, const std::string* prompt_text = nullptr);

// `g` after a <think>...</think> block (engine/grammar/think_grammar.h),
// bounded by the sequence's reasoning budget, for a model that writes one
// (model_type qwen3) when the rendered chat prompt `prompt_text` leaves
// thinking on (grammar::ThinkStartOf: not when the template closed an
// empty block, as Qwen3's does for enable_thinking false); otherwise `g`
// itself (null stays null).
Result<std::shared_ptr<const grammar::Grammar>> WithThinkingBlock(
    std::shared_ptr<const grammar::Grammar> g, const ServedModel& model,
    std::string_view prompt_text);

}  // namespace agentkv::api
