#include "engine/grammar/text_without.h"

#include <vector>

namespace agentkv::grammar {

void TextWithout(GrammarBuilder& b, std::string_view marker, int32_t from, int32_t to,
                 bool reasoning) {
  const size_t m = marker.size();
  std::vector<size_t> fail(m + 1, 0);
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k > 0 && marker[i] != marker[k]) k = fail[k];
    if (marker[i] == marker[k]) ++k;
    fail[i + 1] = k;
  }
  std::vector<int32_t> st(m);
  for (int32_t& n : st) {
    n = b.NewNode();
    if (reasoning) b.MarkReasoning(n);
  }
  b.AddEps(from, st[0]);
  for (size_t j = 0; j < m; ++j) {
    b.AddEps(st[j], to);
    // Bytes with the same target in runs: one edge per run.
    int32_t run_start = -1, run_to = -1;
    for (int c = 0; c <= 256; ++c) {
      int32_t target = -1;
      if (c < 256) {
        size_t k = j;
        while (k > 0 && static_cast<uint8_t>(marker[k]) != c) k = fail[k];
        if (static_cast<uint8_t>(marker[k]) == c) ++k;
        target = k == m ? -2 : st[k];
      }
      if (run_start >= 0 && target != run_to) {
        if (run_to >= 0)
          b.AddBytes(st[j], static_cast<uint8_t>(run_start), static_cast<uint8_t>(c - 1), run_to);
        run_start = -1;
      }
      if (run_start < 0 && c < 256) {
        run_start = c;
        run_to = target;
      }
    }
  }
}

}  // namespace agentkv::grammar
