// OutputEvent: one step of a parsed assistant message as it streams (text,
// reasoning, tool calls), produced by ReasoningParser, ToolCallParser and
// OutputParser and turned into protocol deltas by the API adapters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace agentkv::text::output {

struct OutputEvent {
  enum class Kind : uint8_t {
    kText,           // `text`: a delta of the visible answer
    kReasoning,      // `text`: a delta of the reasoning ("thinking")
    kToolCallBegin,  // `tool_index`, `id`, `name`
    kToolCallArgs,   // `tool_index`, `text`: a fragment of the arguments JSON
    kToolCallEnd,    // `tool_index`: the arguments are complete, valid JSON
    // `tool_index`: the call turned out malformed after its Begin was sent;
    // its raw text follows as kText. Only when arguments are streamed.
    kToolCallAbort,
  };

  Kind kind = Kind::kText;
  std::string text;
  int32_t tool_index = -1;
  std::string id;
  std::string name;

  bool operator==(const OutputEvent&) const = default;

  static OutputEvent Text(std::string t) { return {Kind::kText, std::move(t), -1, {}, {}}; }
  static OutputEvent Reasoning(std::string t) {
    return {Kind::kReasoning, std::move(t), -1, {}, {}};
  }
};

// Appends `e`, merging it into the last event when both are deltas of the
// same kind (and tool call); empty deltas are dropped.
inline void AppendMerged(std::vector<OutputEvent>* out, OutputEvent e) {
  const bool delta = e.kind == OutputEvent::Kind::kText ||
                     e.kind == OutputEvent::Kind::kReasoning ||
                     e.kind == OutputEvent::Kind::kToolCallArgs;
  if (delta && e.text.empty()) return;
  if (delta && !out->empty() && out->back().kind == e.kind &&
      out->back().tool_index == e.tool_index) {
    out->back().text += e.text;
    return;
  }
  out->push_back(std::move(e));
}

}  // namespace agentkv::text::output
