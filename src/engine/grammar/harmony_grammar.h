// Grammars for GPT-OSS's harmony format (engine/text/output/harmony_parser.h
// reads it): constrained tool calls and structured final answers, written
// the way the model writes them, special tokens included.
//
// Generation starts inside an assistant message's header (the prompt ends
// with <|start|>assistant). What the grammars allow, with TEXT any text
// without "<|" (so that the text never spells a marker) and ARGS / CONTENT
// a JSON value following the schema:
//
//   reasoning   <|channel|>analysis<|message|>TEXT<|end|><|start|>assistant
//               (any number of them, before anything else; the model thinks
//               first)
//   a call      <|channel|>commentary to=functions.NAME <|constrain|>json
//               <|message|>ARGS<|call|>
//               or, as agentkv's chat template writes past calls,
//                to=functions.NAME<|channel|>commentary json<|message|>ARGS
//               <|call|>
//   a preamble  <|channel|>commentary<|message|>TEXT<|end|><|start|>assistant
//   an answer   <|channel|>final<|message|>TEXT   (ends with an end token)
//
//   required tool call:  reasoning*, then one call (NAME one of `tools`).
//   auto, strict tools:  (reasoning | preamble)*, then one call or an answer.
//   response format:     reasoning*, then <|channel|>final<|message|>CONTENT.
//
// <|call|> is the model's stop token: the grammar requires it after the
// arguments (no other end token is allowed there), and the sequence ends on
// it. Arguments of tools with !constrain_arguments are any JSON object.
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"
#include "engine/text/tokenizer.h"
#include "util/status.h"

namespace agentkv::grammar {

// The harmony special tokens' ids.
struct HarmonyTokens {
  int32_t start = -1, end = -1, message = -1, channel = -1, constrain = -1, call = -1;
  // From the tokenizer; InvalidArgument when one is missing (not a harmony
  // tokenizer).
  static Result<HarmonyTokens> Find(const text::Tokenizer& tok);
};

// Tool calls (`required`: exactly one call must come; else the output may
// instead be a final answer, see above).
Result<std::shared_ptr<const Grammar>> CompileHarmonyToolCallGrammar(
    const std::vector<ToolGrammarSpec>& tools, bool required, const HarmonyTokens& tokens,
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits = {});

// The final answer's content following `content` (a compiled JSON schema or
// any-object grammar on the same vocabulary).
Result<std::shared_ptr<const Grammar>> CompileHarmonyFinalGrammar(
    const Grammar& content, const HarmonyTokens& tokens,
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits = {});

}  // namespace agentkv::grammar
