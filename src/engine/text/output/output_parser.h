// OutputParser: the parsers a model family needs, chained: reasoning is
// split off first, then tool calls are found in the answer (never inside
// reasoning). Feed the StopChecker's emitted text; get OutputEvents.
//
// Thread-safety: none; one per generated message.
#pragma once

#include <string_view>
#include <vector>

#include "engine/text/output/output_event.h"
#include "engine/text/output/reasoning_parser.h"
#include "engine/text/output/tool_call_parser.h"

namespace agentkv {

struct OutputParserOptions {
  ReasoningParserOptions reasoning;
  ToolCallParserOptions tools;

  // Defaults for a config.json model_type: "qwen3" (reasoning + Hermes tool
  // calls), "qwen2" (Hermes), "llama" (Llama 3.1 JSON), "gemma3" /
  // "gemma3_text" (fenced tool_call blocks); anything else parses nothing.
  // `starts_in_reasoning`: the prompt ends inside <think> (Qwen3 with
  // thinking on). `tools`: the request declared tools (else no tool parsing).
  static OutputParserOptions ForModelType(std::string_view model_type, bool tools,
                                          bool starts_in_reasoning);
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  void Feed(std::string_view text, std::vector<OutputEvent>* out);
  void Finish(std::vector<OutputEvent>* out);

  int32_t num_tool_calls() const { return tools_.num_tool_calls(); }

 private:
  void Route(std::vector<OutputEvent>* out);

  ReasoningParser reasoning_;
  ToolCallParser tools_;
  std::vector<OutputEvent> scratch_;
};

}  // namespace agentkv
