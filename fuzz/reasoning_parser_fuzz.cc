// Fuzzes ReasoningParser (every option) and the OutputParser chains the
// model families use (reasoning, then tool calls in the answer): the
// message is fed whole and again cut at fuzzer-chosen places, and both must
// give the same events (tags split across pieces are held back until
// decided).
#include <fuzzer/FuzzedDataProvider.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/text/output/output_parser.h"
#include "engine/text/output/reasoning_parser.h"
#include "stream_pieces.h"

namespace {

using agentkv::text::output::OutputEvent;

template <typename Parser, typename Options>
std::vector<OutputEvent> Run(const Options& o, const std::vector<std::string_view>& pieces) {
  return agentkv::fuzz::Canonical(agentkv::fuzz::FeedAll<Parser>(o, pieces));
}

void Check(const std::vector<OutputEvent>& whole, const std::vector<OutputEvent>& cut) {
  if (whole == cut) return;
  std::fprintf(stderr, "whole: %s\ncut:   %s\n", agentkv::fuzz::Describe(whole).c_str(),
               agentkv::fuzz::Describe(cut).c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int mode = in.ConsumeIntegralInRange<int>(0, 4);
  const bool flag = in.ConsumeBool();
  const bool tools = in.ConsumeBool();
  const uint32_t seed = in.ConsumeIntegral<uint32_t>();
  const std::string text = in.ConsumeRemainingBytesAsString();
  const auto pieces = agentkv::fuzz::Cut(text, seed);
  if (mode == 0) {
    agentkv::text::output::ReasoningParserOptions o;
    o.enabled = tools;
    o.starts_in_reasoning = flag;
    Check(Run<agentkv::text::output::ReasoningParser>(o, {text}),
          Run<agentkv::text::output::ReasoningParser>(o, pieces));
    return 0;
  }
  static const char* const kTypes[] = {"qwen3", "qwen2", "llama", "gemma3"};
  const auto o =
      agentkv::text::output::OutputParserOptions::ForModelType(kTypes[mode - 1], tools, flag);
  Check(Run<agentkv::text::output::OutputParser>(o, {text}),
        Run<agentkv::text::output::OutputParser>(o, pieces));
  return 0;
}
