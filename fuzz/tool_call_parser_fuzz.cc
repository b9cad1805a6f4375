// Fuzzes ToolCallParser in every format, streamed or not: the message is fed
// whole and again cut at fuzzer-chosen places, and both must give the same
// events (the parser's contract: markers split across pieces are held back
// until decided). Also checks that every Begin is closed by an End or an
// Abort and that tool indices count up from 0.
#include <fuzzer/FuzzedDataProvider.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/text/output/tool_call_parser.h"
#include "stream_pieces.h"

namespace {

using agentkv::text::output::OutputEvent;
using agentkv::text::output::ToolCallParser;
using agentkv::text::output::ToolCallParserOptions;

std::vector<OutputEvent> Run(const ToolCallParserOptions& o,
                             const std::vector<std::string_view>& pieces) {
  return agentkv::fuzz::FeedAll<ToolCallParser>(o, pieces);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ToolCallParserOptions o;
  o.format =
      static_cast<agentkv::text::output::ToolCallFormat>(in.ConsumeIntegralInRange<int>(0, 3));
  o.stream_arguments = in.ConsumeBool();
  const uint32_t seed = in.ConsumeIntegral<uint32_t>();
  const std::string text = in.ConsumeRemainingBytesAsString();

  const auto whole = agentkv::fuzz::Canonical(Run(o, {text}));
  const auto cut = agentkv::fuzz::Canonical(Run(o, agentkv::fuzz::Cut(text, seed)));
  if (whole != cut) {
    std::fprintf(stderr, "whole: %s\ncut:   %s\n", agentkv::fuzz::Describe(whole).c_str(),
                 agentkv::fuzz::Describe(cut).c_str());
    std::abort();
  }
  int32_t open = -1, next = 0;
  for (const OutputEvent& e : whole) {
    switch (e.kind) {
      case OutputEvent::Kind::kToolCallBegin:
        if (open != -1 || e.tool_index != next) std::abort();
        open = e.tool_index;
        ++next;
        break;
      case OutputEvent::Kind::kToolCallArgs:
        if (e.tool_index != open) std::abort();
        break;
      case OutputEvent::Kind::kToolCallEnd:
      case OutputEvent::Kind::kToolCallAbort:
        if (e.tool_index != open) std::abort();
        open = -1;
        break;
      default:
        break;
    }
  }
  if (open != -1) std::abort();
  return 0;
}
