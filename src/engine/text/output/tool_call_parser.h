// ToolCallParser: finds tool calls in an assistant message while it streams
// and turns them into OutputEvents; everything else comes out as text.
// docs/tool-calls.md describes the formats and the events.
//
// Formats:
//  - kHermes (Qwen2.5/Qwen3): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
//    anywhere in the message, any number of times.
//  - kLlama31Json: the whole message is {"name": ..., "parameters": {...}}
//    ("arguments" also accepted), optionally after <|python_tag|>; several
//    calls may follow one another, separated by whitespace or ';'. Decided
//    by the first non-space characters.
//  - kGemmaFenced: ```tool_call\n{"name": ..., "arguments": {...}}\n``` blocks
//    (agentkv's convention; Gemma 3 has no native format).
//  - kHarmony: GPT-OSS's messages to functions.NAME; HarmonyParser reads
//    them (this class passes such text through, as with kNone).
//  - kNone: all text.
//
// Markers split across pieces at any byte are held back until decided. A
// call whose JSON is malformed (or lacks a string "name") comes back as its
// raw text. With stream_arguments, Begin is sent once the name is known and
// the arguments object has started, and argument bytes follow as they
// arrive; a call that breaks after that gets kToolCallAbort, then its raw
// text. Without it, a call's events are sent together once it is complete.
//
// Thread-safety: none; one per generated message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/output/json_stream_scanner.h"
#include "engine/text/output/output_event.h"

namespace agentkv::text::output {

enum class ToolCallFormat { kNone, kHermes, kLlama31Json, kGemmaFenced, kHarmony };

struct ToolCallParserOptions {
  ToolCallFormat format = ToolCallFormat::kNone;
  bool stream_arguments = true;
  // Call ids are id_prefix + 24 alphanumerics derived from id_seed and the
  // call's index, so a replayed message gets the same ids.
  std::string id_prefix = "call_";
  uint64_t id_seed = 0;
};

// A call's id: `prefix` + 24 alphanumerics derived from `seed` and `index`.
std::string ToolCallId(std::string_view prefix, uint64_t seed, int32_t index);

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallParserOptions options);

  // Appends the events `text` completes to `out` (merged, see AppendMerged).
  void Feed(std::string_view text, std::vector<OutputEvent>* out);
  // End of the message: releases held text, settles an unfinished call.
  void Finish(std::vector<OutputEvent>* out);

  // Complete, valid tool calls so far (an API reports finish "tool_calls").
  int32_t num_tool_calls() const { return num_calls_; }

 private:
  enum class Mode {
    kText,         // looking for the open tag
    kLlamaStart,   // before the first non-space byte (Llama)
    kLlamaTagged,  // after <|python_tag|> (Llama)
    kLlamaNext,    // after a call: another one, or text (Llama)
    kCallJson,     // inside a call's JSON
    kCallClose,    // after a call's JSON: whitespace, then the close tag
    kCallError,    // malformed call: looking for its close tag
    kPassThrough,  // text to the end
  };
  static constexpr size_t kNeedMore = static_cast<size_t>(-1);

  size_t Step(std::string_view s, bool final, std::vector<OutputEvent>* out);
  size_t StepJson(std::string_view s, std::vector<OutputEvent>* out);
  void OnMarks(size_t pos, std::vector<OutputEvent>* out);
  void BeginCall(std::string prefix);
  void ResetCall();
  void LlamaToText(std::vector<OutputEvent>* out);
  void CompleteCall(std::vector<OutputEvent>* out);
  void FailCall(size_t search_from, std::vector<OutputEvent>* out);
  void TryBegin(std::vector<OutputEvent>* out);
  void FlushArgs(std::vector<OutputEvent>* out);
  void EmitText(std::string_view t, std::vector<OutputEvent>* out);
  bool tagged() const;

  ToolCallParserOptions opts_;
  std::string open_tag_, close_tag_;
  Mode mode_;
  std::string buf_;  // input not yet consumed (held back)

  // The call being parsed.
  std::string raw_;         // its text from the open tag (or first byte) on
  std::string raw_prefix_;  // Llama: space and <|python_tag|> before a call
  std::string ws_before_;   // text whitespace dropped for the call
  size_t json_start_ = 0;
  JsonStreamScanner scanner_;
  std::string key_;  // last depth-1 key
  size_t key_start_ = 0;
  enum class Role { kOther, kName, kArgs } role_ = Role::kOther;
  size_t name_start_ = 0;
  bool name_seen_ = false;
  std::optional<std::string> name_;
  enum class Args { kNone, kObject, kString, kNull } args_ = Args::kNone;
  size_t args_start_ = 0, args_end_ = 0;
  bool args_open_ = false;   // streaming bytes of an arguments object
  std::string args_unsent_;  // argument bytes not yet in an event
  bool begun_ = false;       // Begin sent for this call
  int32_t index_ = -1;       // this call's tool_index once begun
  size_t search_from_ = 0;   // kCallError: where the close tag may start

  int32_t next_index_ = 0;
  int32_t num_calls_ = 0;

  // Text output: whitespace next to a tool call is dropped (trailing
  // whitespace is held until non-space text shows it is not).
  std::string ws_;
  bool strip_leading_ = false;
};

}  // namespace agentkv::text::output
