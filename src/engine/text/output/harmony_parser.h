// HarmonyParser: reads what GPT-OSS writes in OpenAI's harmony format as it
// streams and turns it into OutputEvents (docs/tool-calls.md, "Harmony").
//
// The text must carry the format's markers, which are special tokens
// (<|start|>, <|channel|>, <|message|>, <|end|>, <|call|>, <|return|>,
// <|constrain|>): decode with skip_special_tokens off. OutputParser does that
// from the token ids.
//
// A message is <|start|>HEADER<|message|>BODY followed by <|end|>, <|call|>
// or <|return|>. Generation starts inside the header of an assistant message
// (the prompt ends with <|start|>assistant). A header holds the role, the
// channel (<|channel|>NAME), an optional recipient (to=functions.NAME, before
// or after the channel) and an optional content type (json, <|constrain|>json).
// Bodies go to:
//   - analysis channel                         -> kReasoning
//   - final, commentary, a missing or unknown
//     channel (nothing is dropped)             -> kText
//   - a recipient, with tools on               -> a tool call: functions.NAME
//     is named NAME (another recipient keeps its full name), the body is
//     its arguments, a JSON object (an empty body is {})
//   - a recipient with tools off, or a role other than the assistant's (the
//     model writing a tool's reply itself) -> the raw header and body as kText
// Malformed output keeps its text: a header that meets an end marker, a byte
// no header has, or more than kMaxHeaderBytes before <|message|> comes back
// raw as kText, and what follows it up to the end marker is text; arguments
// that are not a JSON object give kToolCallAbort (when the call had begun)
// and the raw call as kText; a <|start|> or <|channel|> inside a body ends
// the message as <|end|> would; text between messages is kText (whitespace
// there is dropped). Markers cut anywhere across pieces are held back until
// decided, so events never depend on how the text was split.
//
// Thread-safety: none; one per generated message.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/output/output_event.h"
#include "engine/text/output/tool_call_parser.h"

namespace agentkv::text::output {

class HarmonyParser {
 public:
  // What a message header says. Empty strings for what it leaves out.
  struct Header {
    std::string role;
    std::string channel;
    std::string recipient;
    std::string content_type;
    bool operator==(const Header&) const = default;
  };
  // Reads a header's text (what comes between <|start|> and <|message|>).
  static Header ParseHeader(std::string_view text);

  static constexpr size_t kMaxHeaderBytes = 256;

  // Tool calls are parsed when tools.format is kHarmony; ids and argument
  // streaming follow `tools` as in ToolCallParser.
  explicit HarmonyParser(ToolCallParserOptions tools);

  void Feed(std::string_view text, std::vector<OutputEvent>* out);
  // End of the generation (it stops on <|return|> or <|call|>, which the
  // text need not contain): settles the message in progress.
  void Finish(std::vector<OutputEvent>* out);

  // Complete, valid tool calls so far.
  int32_t num_tool_calls() const { return num_calls_; }

 private:
  enum class Mode { kHeader, kBody, kBetween };
  enum class Dest { kText, kReasoning, kToolCall };

  void Run(bool final, std::vector<OutputEvent>* out);
  // Each consumes from the front of `s` and returns false when it needs more.
  bool StepHeader(std::string_view& s, bool final, std::vector<OutputEvent>* out);
  bool StepBody(std::string_view& s, bool final, std::vector<OutputEvent>* out);
  bool StepBetween(std::string_view& s, bool final, std::vector<OutputEvent>* out);
  void StartBody(std::vector<OutputEvent>* out);
  void HeaderFailed(std::vector<OutputEvent>* out);
  void EmitBody(std::string_view t, std::vector<OutputEvent>* out);
  void EndMessage(std::vector<OutputEvent>* out);
  void StartHeader();

  ToolCallParserOptions opts_;
  bool tools_;
  Mode mode_ = Mode::kHeader;
  std::string buf_;  // input not yet consumed (a marker may be cut)

  // The message in progress.
  std::string header_;  // raw header text so far
  Dest dest_ = Dest::kText;
  std::string name_;         // tool call
  std::string args_;         // tool call body as written
  bool args_begun_ = false;  // a non-space argument byte was seen
  bool begun_ = false;       // kToolCallBegin sent
  int32_t index_ = -1;

  std::string ws_;  // whitespace between messages, held until text shows it matters
  int32_t next_index_ = 0;
  int32_t num_calls_ = 0;
};

}  // namespace agentkv::text::output
