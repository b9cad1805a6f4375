// OutputParser: the parsers a model family needs, chained: reasoning is
// split off first, then tool calls are found in the answer (never inside
// reasoning). Feed the StopChecker's emitted text; get OutputEvents. GPT-OSS's
// harmony format replaces both: its channels carry reasoning, answer and tool
// calls, and its markers are special tokens, so it reads the token ids.
//
// Thread-safety: none; one per generated message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "engine/text/output/harmony_parser.h"
#include "engine/text/output/output_event.h"
#include "engine/text/output/reasoning_parser.h"
#include "engine/text/output/tool_call_parser.h"
#include "engine/text/stream_detokenizer.h"
#include "engine/text/tokenizer.h"

namespace agentkv::text::output {

struct OutputParserOptions {
  ReasoningParserOptions reasoning;
  ToolCallParserOptions tools;
  // The harmony format (HarmonyParser) instead of `reasoning` and `tools`;
  // tools.format kHarmony turns its tool calls on.
  bool harmony = false;
  // The model's tokenizer: harmony decodes the token ids with it, keeping
  // the markers the engine's text leaves out. Without it harmony reads the
  // engine's text, which has no markers: everything comes out as text.
  std::shared_ptr<const Tokenizer> tokenizer;

  // Defaults for a config.json model_type: "qwen3" (reasoning + Hermes tool
  // calls), "qwen2" (Hermes), "llama" (Llama 3.1 JSON), "gemma3" /
  // "gemma3_text" (fenced tool_call blocks), "gpt_oss" (harmony; set
  // `tokenizer`); anything else parses nothing.
  // `starts_in_reasoning`: the prompt ends inside <think> (Qwen3 with
  // thinking on). `tools`: the request declared tools (else no tool parsing).
  static OutputParserOptions ForModelType(std::string_view model_type, bool tools,
                                          bool starts_in_reasoning);
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  // Text as the format reads it (for harmony: with its markers).
  void Feed(std::string_view text, std::vector<OutputEvent>* out);
  // One delta of the engine: its new token ids and its text for them
  // (special tokens left out, stop strings cut). Harmony with a tokenizer
  // decodes `tokens`; every other format reads `text`.
  void Feed(std::span<const int32_t> tokens, std::string_view text, std::vector<OutputEvent>* out);
  void Finish(std::vector<OutputEvent>* out);

  int32_t num_tool_calls() const {
    return harmony_ ? harmony_->num_tool_calls() : tools_.num_tool_calls();
  }

 private:
  void Route(std::vector<OutputEvent>* out);

  ReasoningParser reasoning_;
  ToolCallParser tools_;
  std::optional<HarmonyParser> harmony_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<StreamDetokenizer> detok_;  // harmony with a tokenizer
  std::vector<OutputEvent> scratch_;
};

}  // namespace agentkv::text::output
