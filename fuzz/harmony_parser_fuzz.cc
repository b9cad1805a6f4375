// Fuzzes HarmonyParser with tools on or off, streamed or not: the message is
// fed whole and again cut at fuzzer-chosen places, and both must give the
// same events (markers split across pieces are held back until decided).
// Also checks that every Begin is closed by an End or an Abort, that tool
// indices count up from 0, that completed calls carry JSON objects, and that
// no text is duplicated.
#include <fuzzer/FuzzedDataProvider.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/output/harmony_parser.h"
#include "stream_pieces.h"

namespace {

using agentkv::text::output::HarmonyParser;
using agentkv::text::output::OutputEvent;
using agentkv::text::output::ToolCallParserOptions;

std::vector<OutputEvent> Run(const ToolCallParserOptions& o,
                             const std::vector<std::string_view>& pieces) {
  return agentkv::fuzz::FeedAll<HarmonyParser>(o, pieces);
}

// Letters and digits only: what no marker or separator can swallow.
std::string Alnum(std::string_view s) {
  std::string out;
  for (char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) out += c;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ToolCallParserOptions o;
  o.format = in.ConsumeBool() ? agentkv::text::output::ToolCallFormat::kHarmony
                              : agentkv::text::output::ToolCallFormat::kNone;
  o.stream_arguments = in.ConsumeBool();
  const uint32_t seed = in.ConsumeIntegral<uint32_t>();
  const std::string text = in.ConsumeRemainingBytesAsString();

  const auto events = Run(o, {text});
  const auto whole = agentkv::fuzz::Canonical(events);
  const auto cut = agentkv::fuzz::Canonical(Run(o, agentkv::fuzz::Cut(text, seed)));
  if (whole != cut) {
    std::fprintf(stderr, "whole: %s\ncut:   %s\n", agentkv::fuzz::Describe(whole).c_str(),
                 agentkv::fuzz::Describe(cut).c_str());
    std::abort();
  }
  int32_t open = -1, next = 0;
  std::string name, args, out_text;
  for (const OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEvent::Kind::kToolCallBegin:
        if (open != -1 || e.tool_index != next) std::abort();
        open = e.tool_index;
        ++next;
        name = e.name;
        args.clear();
        break;
      case OutputEvent::Kind::kToolCallArgs:
        if (e.tool_index != open) std::abort();
        args += e.text;
        break;
      case OutputEvent::Kind::kToolCallEnd:
        if (e.tool_index != open) std::abort();
        if (!nlohmann::json::parse(args, nullptr, false).is_object()) std::abort();
        out_text += name + args;
        open = -1;
        break;
      case OutputEvent::Kind::kToolCallAbort:
        if (e.tool_index != open) std::abort();
        open = -1;
        break;
      default:
        out_text += e.text;
        break;
    }
  }
  if (open != -1) std::abort();
  // Nothing comes back twice: the output (text, reasoning, completed calls;
  // an aborted call comes back as text) has no more letters and digits than
  // the input (headers and markers are dropped, so fewer is normal).
  if (Alnum(out_text).size() > Alnum(text).size()) std::abort();
  return 0;
}
