// ReasoningParser: splits a streamed assistant message into reasoning
// (<think>...</think> at the start, as Qwen3 writes it) and the answer.
//
// The open tag counts only at the start of the message (after whitespace);
// with starts_in_reasoning (the chat template already put <think> in the
// prompt) the message is reasoning until the close tag, and an open tag the
// model writes anyway is skipped. Whitespace at the edges of the reasoning,
// and before the answer that follows it, is dropped. Tags split across
// pieces are held back until decided. Emits kReasoning and kText events.
//
// Thread-safety: none; one per generated message.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/text/output/output_event.h"

namespace agentkv::text::output {

struct ReasoningParserOptions {
  bool enabled = false;  // off: everything is text
  bool starts_in_reasoning = false;
  std::string open_tag = "<think>";
  std::string close_tag = "</think>";
};

class ReasoningParser {
 public:
  explicit ReasoningParser(ReasoningParserOptions options);

  void Feed(std::string_view text, std::vector<OutputEvent>* out);
  // End of the message: releases held text (an unclosed reasoning block
  // stays reasoning).
  void Finish(std::vector<OutputEvent>* out);

 private:
  enum class Mode { kStart, kReasoning, kAnswer };
  void Run(bool final, std::vector<OutputEvent>* out);
  void EmitReasoning(std::string_view t, std::vector<OutputEvent>* out);
  void EmitAnswer(std::string_view t, std::vector<OutputEvent>* out);

  ReasoningParserOptions opts_;
  Mode mode_;
  std::string buf_;             // held back: a possible tag
  std::string ws_;              // trailing reasoning whitespace, held
  bool strip_leading_ = false;  // of the current reasoning/answer segment
};

}  // namespace agentkv::text::output
