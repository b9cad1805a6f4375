// GrammarMatcher: one sequence's position in a Grammar: which tokens may
// come next (FillMask) and moving on by the token chosen (Advance).
//
// The state is the set of the grammar's stacks that the output so far can
// be in (several where anyOf alternatives share a prefix), each with its
// top at a node that reads a byte, plus whether the output so far is a
// complete match. A token is allowed when its bytes, read one by one from
// the state, leave a non-empty state (a prefix that can still be finished)
// or a complete match; a token without bytes (a special token) is allowed
// where a stack's top has a token edge for it. The mask walks the vocabulary's trie with the
// automaton, pruning a prefix's whole subtree once it dies; masks of states
// that recur (inside an unbounded string, for instance) come from the
// grammar's cache.
//
// End-of-sequence is the caller's: allow it exactly when accepting() (and
// only it when complete()).
//
// Thread-safety: none; one thread uses a matcher at a time. Matchers of one
// Grammar may run on different threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/grammar/grammar.h"
#include "util/status.h"

namespace agentkv::grammar {

// A set of stacks, flat: [len, frame 0 (bottom) .. frame len-1 (top)]...
struct GrammarState {
  std::vector<int32_t> frames;
  bool accepting = false;
  bool empty() const { return frames.empty() && !accepting; }
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Sets bit t of `mask` (vocab_size bits, cleared first) for every token t
  // whose bytes keep the output viable. End-of-sequence tokens are not set.
  void FillMask(std::span<uint64_t> mask);
  // Reads the token's bytes. InvalidArgument (state unchanged) when the
  // token is not allowed here or not in the vocabulary.
  Status Advance(int32_t token);
  // Reads raw bytes (tests). InvalidArgument (state unchanged) on a byte
  // the grammar does not allow.
  Status AdvanceBytes(std::string_view bytes);

  // The output so far is a complete match.
  bool accepting() const { return state_.accepting; }
  // Nothing more may follow: the only way on is to stop.
  bool complete() const { return state_.frames.empty(); }
  const Grammar& grammar() const { return *grammar_; }
  const GrammarState& state() const { return state_; }

  // For tests and benchmarks: trie nodes the last FillMask walked (0 when
  // it came from the cache).
  int64_t last_walked() const { return last_walked_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  GrammarState state_;
  int64_t last_walked_ = 0;
};

// The state reached from `in` by reading `byte` (cleared first). Pure.
void GrammarStep(const Grammar& g, const GrammarState& in, uint8_t byte, GrammarState* out);
// The state reached from `in` by reading the whole token `token` along
// token edges (cleared first; empty when no top has an edge for it). Pure.
void GrammarStepToken(const Grammar& g, const GrammarState& in, int32_t token, GrammarState* out);
// The start state of `g`.
GrammarState GrammarStart(const Grammar& g);

}  // namespace agentkv::grammar
