// Helpers shared by the output parsers' tests: feed pieces to a parser and
// print the events it gave compactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/text/output/output_event.h"
#include "engine/text/output/tool_call_parser.h"

namespace agentkv::testing {

using Events = std::vector<text::output::OutputEvent>;

// Feeds `pieces` in order to a fresh `Parser` built from `o`, then finishes
// it; the events, with the number of tool calls in *calls when given.
template <class Parser>
Events RunParser(const text::output::ToolCallParserOptions& o,
                 const std::vector<std::string>& pieces, int32_t* calls = nullptr) {
  Parser p(o);
  Events out;
  for (const std::string& s : pieces) p.Feed(s, &out);
  p.Finish(&out);
  if (calls) *calls = p.num_tool_calls();
  return out;
}

// A compact view for assertions: T(text) R(reasoning) B<index>(name) A(args)
// E(end) X(abort).
inline std::string Describe(const Events& events) {
  std::string s;
  for (const text::output::OutputEvent& e : events) {
    switch (e.kind) {
      case text::output::OutputEvent::Kind::kText:
        s += "T(" + e.text + ")";
        break;
      case text::output::OutputEvent::Kind::kReasoning:
        s += "R(" + e.text + ")";
        break;
      case text::output::OutputEvent::Kind::kToolCallBegin:
        s += "B" + std::to_string(e.tool_index) + "(" + e.name + ")";
        break;
      case text::output::OutputEvent::Kind::kToolCallArgs:
        s += "A(" + e.text + ")";
        break;
      case text::output::OutputEvent::Kind::kToolCallEnd:
        s += "E";
        break;
      case text::output::OutputEvent::Kind::kToolCallAbort:
        s += "X";
        break;
    }
  }
  return s;
}

}  // namespace agentkv::testing
