// GrammarConstraint: one sequence's constrained decoding inside its
// Sampler: masks a logits row to the tokens the grammar allows next and
// follows the tokens chosen.
//
// End tokens (the model's EOS ids and the request's stop_token_ids) are
// allowed exactly where the output so far is a complete match; once
// nothing more may follow, they are the only tokens allowed. Should the
// grammar allow no token at all (a vocabulary that cannot spell any
// continuation, or a recursion past the depth bound), the end tokens are
// allowed so that the sequence still stops.
//
// Reasoning budget: the tokens read while the matcher is in_reasoning()
// (harmony's analysis and preamble messages) are counted; once they reach
// the budget, the matcher's reasoning is closed after every token
// (GrammarMatcher::CloseReasoning), so the output leaves its reasoning and
// goes on to what the grammar asks for. A negative budget: unbounded.
//
// Thread-safety: none; the owning Sampler's thread. Constraints of one
// Grammar may run on different threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/grammar/grammar_matcher.h"

namespace agentkv::engine {

class GrammarConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const grammar::Grammar> grammar, std::vector<int32_t> end_ids,
                    int32_t reasoning_budget = -1);

  // Sets every disallowed entry of `logits` to -inf.
  void Apply(std::span<float> logits);
  // What Argmax after Apply gives (the lowest id on ties, NaN never wins;
  // 0 when nothing is allowed or every allowed entry is -inf or NaN),
  // reading only the allowed entries and writing nothing.
  int32_t AllowedArgmax(std::span<const float> logits);
  // Follows `token` (chosen from a masked row, or restored output). An end
  // token or one the grammar does not allow leaves the state as it is.
  void Accept(int32_t token);
  // Follows `token` when Apply would have left it unmasked and returns
  // true; else returns false and leaves the state as it is. An end token:
  // true where the output so far is a complete match (the other case
  // Apply allows one, no token allowed at all, answers false: the caller
  // then masks the row). Costs one walk of the token's bytes, not a mask.
  bool TryAccept(int32_t token);

  const grammar::GrammarMatcher& matcher() const { return matcher_; }
  // Tokens counted against the reasoning budget so far.
  int32_t reasoning_tokens() const { return reasoning_tokens_; }

 private:
  // The allowed tokens of the next position, `n` bits (end tokens
  // included as Apply allows them); per thread, valid until the next call
  // on this thread.
  const std::vector<uint64_t>& Mask(size_t n);

  grammar::GrammarMatcher matcher_;
  std::vector<int32_t> end_ids_;
  int32_t reasoning_budget_;
  int32_t reasoning_tokens_ = 0;
};

}  // namespace agentkv::engine
