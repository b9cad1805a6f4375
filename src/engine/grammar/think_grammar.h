// Grammars for models that think in a <think>...</think> block at the start
// of their reply (Qwen3; engine/text/output/reasoning_parser.h reads it):
// a constrained reply (a JSON schema, a tool call) with room for the
// reasoning before it, which the reasoning budget bounds.
//
// What the grammar allows, with TEXT any text without "</think>" (so that
// the reasoning parser's block ends where the grammar's does), WS up to 4
// bytes of whitespace and ANSWER what `content` matches:
//
//   kMayOpen (the prompt ends at the reply's start):
//     <think>TEXT</think>WS ANSWER   or   ANSWER
//   kOpen (the chat template opened the block itself):
//     TEXT</think>WS ANSWER
//
// "<think>" and its first byte's node and TEXT are reasoning nodes
// (GrammarNode::reasoning): once a sequence's reasoning budget is spent
// (SamplingParams::reasoning_budget, GrammarConstraint) no block may open,
// and one being written must close: "</think>" (or the rest of it, where
// the text ends in its start) is all that may come, then the answer. The
// tags are matched by their bytes (Qwen3's <think> and </think> are added
// tokens that are not special: the vocabulary holds them as those bytes).
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string_view>

#include "engine/grammar/grammar.h"
#include "util/status.h"

namespace agentkv::grammar {

// Where a rendered chat prompt leaves the reply's reasoning block.
enum class ThinkStart {
  kNone,     // no block: the template wrote an empty one (thinking off)
  kMayOpen,  // the reply may open one (thinking on, the template's default)
  kOpen,     // the template opened it: the reply starts inside it
};

// From the end of `prompt` (the rendered chat prompt, generation prompt
// included), trailing whitespace ignored: ending in "</think>" is kNone
// (Qwen3's template writes "<think>\n\n</think>\n\n" when enable_thinking
// is false), in "<think>" kOpen, anything else kMayOpen. Pure.
ThinkStart ThinkStartOf(std::string_view prompt);

// `content` (a grammar on the same vocabulary: a compiled JSON schema, a
// tool call) after a reasoning block, as above. InvalidArgument for
// kNone (nothing to add: use `content` itself).
Result<std::shared_ptr<const Grammar>> CompileThinkThenGrammar(
    const Grammar& content, ThinkStart start, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarLimits limits = {});

}  // namespace agentkv::grammar
