// Grammar: a compiled byte-level grammar (a recursive transition network: a
// set of NFAs over bytes that call one another, i.e. a pushdown automaton),
// what a JSON schema compiles to (json_schema.h). Immutable once built,
// except for its mask cache, which is internally synchronized.
//
// A node has byte edges (a byte range to a target node), token edges (one
// token id, read whole, to a target node: how a grammar names the special
// tokens that the byte-level vocabulary leaves out, e.g. harmony's
// <|channel|>), epsilon edges and call edges (run the rule starting at `start`, then continue at
// `ret`); a node marked `end` finishes the rule it is in (returns to the caller, or accepts the
// whole input when nothing called it). A matcher's state is a set of stacks of nodes
// (grammar_matcher.h): the top is where the input is now, the frames below are where each enclosing
// call returns to.
//
// String-body nodes (string_remaining >= 0) are where a JSON string
// accepts any plain character: every token made only of plain characters
// (token_vocabulary.h) moves such a node to the node that many characters
// further, and nothing else of that token can leave the string. The mask
// uses this to decide those tokens without walking them byte by byte.
//
// Thread-safety: const methods may run concurrently (the cache takes a lock).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/grammar/token_vocabulary.h"
#include "util/status.h"

namespace agentkv::grammar {

struct GrammarNode {
  struct ByteEdge {
    uint8_t lo, hi;
    int32_t to;
  };
  struct CallEdge {
    int32_t start, ret;
  };
  struct TokenEdge {
    int32_t id;
    int32_t to;
  };
  std::vector<ByteEdge> bytes;
  std::vector<TokenEdge> tokens;
  std::vector<int32_t> eps;
  std::vector<CallEdge> calls;
  bool end = false;
  // >= 0: a string-body node that still takes this many plain characters
  // (kUnboundedChars: any number), every plain character moving to the
  // node for one fewer (or to itself when unbounded).
  int32_t string_remaining = -1;
};

// Limits on what one request's schema may compile to.
struct GrammarLimits {
  int32_t max_nodes = 200000;
  int32_t max_stack_depth = 48;  // nested calls: bounds recursion ($ref, JSON nesting)
};

class GrammarBuilder;

class Grammar {
 public:
  static constexpr int32_t kUnboundedChars = std::numeric_limits<int32_t>::max();

  const std::vector<GrammarNode>& nodes() const { return nodes_; }
  int32_t root() const { return root_; }
  const GrammarLimits& limits() const { return limits_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  const std::shared_ptr<const TokenVocabulary>& vocab_ptr() const { return vocab_; }

  // The mask cache: the allowed-token bitset for a state key (the matcher's
  // canonical state). Null when absent. Bounded (kMaxCachedMasks, cleared
  // when full).
  std::shared_ptr<const std::vector<uint64_t>> FindMask(const std::vector<int32_t>& key) const;
  void StoreMask(const std::vector<int32_t>& key,
                 std::shared_ptr<const std::vector<uint64_t>> mask) const;

 private:
  friend class GrammarBuilder;
  static constexpr size_t kMaxCachedMasks = 256;
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& k) const;
  };

  std::vector<GrammarNode> nodes_;
  int32_t root_ = 0;
  GrammarLimits limits_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::vector<int32_t>, std::shared_ptr<const std::vector<uint64_t>>,
                             KeyHash>
      cache_;
};

// Builds a Grammar node by node. Every Add* checks the node limit; the
// first failure sticks and Finish() returns it. Not thread-safe.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(GrammarLimits limits) : limits_(limits) {}

  int32_t NewNode();
  void AddBytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to);
  void AddByte(int32_t from, uint8_t b, int32_t to) { AddBytes(from, b, b, to); }
  // A new node reached from `from` by `b`.
  int32_t NewNodeAfter(int32_t from, uint8_t b) {
    const int32_t n = NewNode();
    AddByte(from, b, n);
    return n;
  }
  void AddEps(int32_t from, int32_t to);
  void AddCall(int32_t from, int32_t start, int32_t ret);
  // Reading token `id` whole moves `from` to `to`. For tokens the
  // vocabulary leaves out (special tokens); a token with bytes is matched
  // by its bytes, never by a token edge. `id` must be below the
  // vocabulary's size (Finish checks).
  void AddToken(int32_t from, int32_t id, int32_t to);
  // Copies every node of `g` (built on the same vocabulary) into this
  // grammar and returns where its root now is: calling that node (AddCall)
  // matches what `g` matches, its end nodes returning to the caller. How a
  // compiled JSON schema becomes one part of a larger grammar.
  int32_t Splice(const Grammar& g);
  void MarkEnd(int32_t node);
  void SetStringRemaining(int32_t node, int32_t remaining);
  // Bytes of `text` in order, from `from` to `to`.
  void AddLiteral(int32_t from, std::string_view text, int32_t to);

  // The first error met so far (the node limit).
  const Status& status() const { return status_; }
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }

  Result<std::shared_ptr<const Grammar>> Finish(int32_t root,
                                                std::shared_ptr<const TokenVocabulary> vocab);

 private:
  GrammarLimits limits_;
  std::vector<GrammarNode> nodes_;
  Status status_;
};

}  // namespace agentkv::grammar
