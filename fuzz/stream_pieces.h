// Helpers the streaming-parser fuzz targets share: cutting a text into
// pieces at fuzzer-chosen places, and a canonical form of an event list
// (adjacent deltas merged) so that different cuts of one text compare equal
// exactly when the parser's contract says they must.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/output/output_event.h"

namespace agentkv::fuzz {

// Pieces of `text` whose lengths come from a small generator seeded by
// `seed` (0..15 bytes each, empty pieces included: a detokenizer can emit
// nothing for a token).
inline std::vector<std::string_view> Cut(std::string_view text, uint32_t seed) {
  std::vector<std::string_view> pieces;
  uint32_t x = seed | 1;
  size_t pos = 0;
  while (pos < text.size()) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const size_t n = x % 16;
    pieces.push_back(text.substr(pos, n));
    pos += n;
  }
  return pieces;
}

// Feeds `pieces` in order to a fresh `Parser` built from `options`, then
// finishes it; every event it gave.
template <class Parser, class Options>
std::vector<text::output::OutputEvent> FeedAll(const Options& options,
                                               const std::vector<std::string_view>& pieces) {
  Parser p(options);
  std::vector<text::output::OutputEvent> out;
  for (std::string_view s : pieces) p.Feed(s, &out);
  p.Finish(&out);
  return out;
}

inline std::vector<text::output::OutputEvent> Canonical(
    const std::vector<text::output::OutputEvent>& events) {
  std::vector<text::output::OutputEvent> out;
  for (const text::output::OutputEvent& e : events) text::output::AppendMerged(&out, e);
  return out;
}

inline std::string Describe(const std::vector<text::output::OutputEvent>& events) {
  std::string s;
  for (const text::output::OutputEvent& e : events) {
    s += std::to_string(static_cast<int>(e.kind)) + "/" + std::to_string(e.tool_index) + "[" +
         e.name + "|" + e.id + "|" + e.text + "] ";
  }
  return s;
}

}  // namespace agentkv::fuzz
