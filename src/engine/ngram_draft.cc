#include "engine/ngram_draft.h"

#include <algorithm>

namespace agentkv::engine {

std::vector<int32_t> ProposeNgramDraft(std::span<const int32_t> tokens, int max_tokens,
                                       const NgramDraftOptions& options) {
  std::vector<int32_t> draft;
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || len < 2) return draft;
  const int64_t window_start =
      std::max<int64_t>(0, len - std::max<int64_t>(options.max_lookback, 2));
  for (int n = std::max(options.max_ngram, 1); n >= std::max(options.min_ngram, 1); --n) {
    if (n >= len) continue;
    const std::span<const int32_t> key = tokens.subspan(static_cast<size_t>(len - n));
    // Candidate starts p with p + n < len (a token follows the match) and
    // p != len - n (the suffix itself), most recent first.
    for (int64_t p = len - n - 1; p >= window_start; --p) {
      if (!std::equal(key.begin(), key.end(), tokens.begin() + p)) continue;
      // What followed the match, read on into the draft itself where it
      // reaches the end: a repeating pattern is drafted for its whole
      // length, not only up to the end of the tokens.
      const int64_t from = p + n;
      draft.reserve(static_cast<size_t>(max_tokens));
      for (int64_t i = from; static_cast<int>(draft.size()) < max_tokens; ++i)
        draft.push_back(i < len ? tokens[static_cast<size_t>(i)]
                                : draft[static_cast<size_t>(i - len)]);
      return draft;
    }
  }
  return draft;
}

}  // namespace agentkv::engine
