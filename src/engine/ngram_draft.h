// ProposeNgramDraft: speculative drafts looked up in a sequence's own tokens
// (prompt lookup). Coding agents mostly rewrite text already in their
// context (a file they read, then edit): the tokens that followed the last
// occurrence of the sequence's newest n-gram are a good guess of what comes
// next, at no model cost.
//
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace agentkv::engine {

struct NgramDraftOptions {
  int max_ngram = 3;  // the longest suffix looked up first, then shorter ones
  int min_ngram = 1;
  // Only the last `max_lookback` tokens are searched, so that a step's work
  // per sequence is bounded (max_ngram * max_lookback comparisons at most).
  int64_t max_lookback = 8192;
};

// Up to `max_tokens` draft tokens for what follows `tokens` (all real: no
// placeholders). For n from max_ngram down to min_ngram: the most recent
// earlier occurrence of the last n tokens inside the lookback window that
// has at least one token after it; the draft is what followed it, read on
// into the draft itself past the end (so a repeating pattern is drafted to
// max_tokens). Empty when nothing matches or max_tokens <= 0.
std::vector<int32_t> ProposeNgramDraft(std::span<const int32_t> tokens, int max_tokens,
                                       const NgramDraftOptions& options = {});

}  // namespace agentkv::engine
