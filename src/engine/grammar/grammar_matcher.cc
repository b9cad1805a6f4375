#include "engine/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>

namespace agentkv::grammar {
namespace {

// Closure of one step: follows epsilon edges, calls and returns from a
// stack until every stack's top reads a byte or a token; `visited` dedups stacks met
// in this closure (the grammar may have epsilon cycles). Iterative (an
// explicit work list): epsilon chains may be long. Bounded: a closure
// visits at most kMaxClosureInts of stacks; past that (only a pathological
// schema, e.g. thousands of nested optional groups in one pattern) the
// remaining stacks are dropped, which only narrows what may be written.
class Closure {
 public:
  static constexpr int32_t kMaxFrames = 256;
  static constexpr size_t kMaxClosureInts = size_t{1} << 12;

  Closure(const Grammar& g, GrammarState* out, std::vector<int32_t>* visited)
      : g_(g), out_(out), visited_(visited), max_depth_(g.limits().max_stack_depth) {}

  void Explore(const int32_t* frames, int32_t len) {
    thread_local std::vector<int32_t> work;
    work.clear();
    Push(work, frames, len);
    int32_t cur[kMaxFrames + 2];
    while (!work.empty()) {
      // Pop the last entry: [frames..., len].
      const int32_t l = work.back();
      work.pop_back();
      std::memcpy(cur, work.data() + work.size() - static_cast<size_t>(l),
                  sizeof(int32_t) * static_cast<size_t>(l));
      work.resize(work.size() - static_cast<size_t>(l));
      if (visited_->size() > kMaxClosureInts || Seen(cur, l)) continue;
      visited_->push_back(l);
      visited_->insert(visited_->end(), cur, cur + l);
      const GrammarNode& n = g_.nodes()[static_cast<size_t>(cur[l - 1])];
      if (!n.bytes.empty() || !n.tokens.empty()) {
        out_->frames.push_back(l);
        out_->frames.insert(out_->frames.end(), cur, cur + l);
      }
      if (n.end) {
        if (l == 1) {
          out_->accepting = true;
        } else {
          Push(work, cur, l - 1);
        }
      }
      const int32_t top = cur[l - 1];
      for (int32_t e : n.eps) {
        cur[l - 1] = e;
        Push(work, cur, l);
      }
      cur[l - 1] = top;
      if (l >= max_depth_) continue;  // the recursion bound: deeper calls die
      for (const GrammarNode::CallEdge& c : n.calls) {
        cur[l - 1] = c.ret;
        cur[l] = c.start;
        Push(work, cur, l + 1);
      }
    }
  }

 private:
  static void Push(std::vector<int32_t>& work, const int32_t* frames, int32_t len) {
    work.insert(work.end(), frames, frames + len);
    work.push_back(len);
  }

  bool Seen(const int32_t* frames, int32_t len) const {
    const std::vector<int32_t>& v = *visited_;
    size_t i = 0;
    while (i < v.size()) {
      const int32_t l = v[i];
      if (l == len &&
          std::memcmp(&v[i + 1], frames, sizeof(int32_t) * static_cast<size_t>(len)) == 0)
        return true;
      i += static_cast<size_t>(l) + 1;
    }
    return false;
  }

  const Grammar& g_;
  GrammarState* out_;
  std::vector<int32_t>* visited_;
  int32_t max_depth_;
};

std::vector<int32_t>& VisitedScratch() {
  thread_local std::vector<int32_t> v;
  return v;
}

// The state's stacks sorted, so equal sets give equal keys.
void CanonicalKey(const GrammarState& s, std::vector<int32_t>* key) {
  std::vector<std::pair<size_t, int32_t>> spans;  // offset, len
  for (size_t i = 0; i < s.frames.size(); i += static_cast<size_t>(s.frames[i]) + 1)
    spans.emplace_back(i + 1, s.frames[i]);
  std::sort(spans.begin(), spans.end(), [&](const auto& a, const auto& b) {
    return std::lexicographical_compare(s.frames.begin() + static_cast<long>(a.first),
                                        s.frames.begin() + static_cast<long>(a.first + a.second),
                                        s.frames.begin() + static_cast<long>(b.first),
                                        s.frames.begin() + static_cast<long>(b.first + b.second));
  });
  key->clear();
  key->push_back(s.accepting ? 1 : 0);
  for (const auto& [off, len] : spans) {
    key->push_back(len);
    key->insert(key->end(), s.frames.begin() + static_cast<long>(off),
                s.frames.begin() + static_cast<long>(off + static_cast<size_t>(len)));
  }
}

inline void SetBit(std::span<uint64_t> mask, int32_t id) {
  mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
}

// Walks `trie` from `start`, setting the bits of every token that leaves a
// viable state. Returns the trie nodes visited.
int64_t WalkTrie(const Grammar& g, const TokenVocabulary::Trie& trie, const GrammarState& start,
                 std::span<uint64_t> mask) {
  thread_local std::vector<GrammarState> levels;
  if (levels.size() < static_cast<size_t>(trie.max_depth) + 1)
    levels.resize(static_cast<size_t>(trie.max_depth) + 1);
  levels[0] = start;
  const auto n = static_cast<int32_t>(trie.byte.size());
  int64_t visited = 0;
  int32_t i = 1;
  while (i < n) {
    ++visited;
    const int32_t d = trie.depth[static_cast<size_t>(i)];
    GrammarState& cur = levels[static_cast<size_t>(d)];
    GrammarStep(g, levels[static_cast<size_t>(d - 1)], trie.byte[static_cast<size_t>(i)], &cur);
    if (cur.empty()) {
      i = trie.subtree_end[static_cast<size_t>(i)];
      continue;
    }
    for (int32_t k = trie.token_begin[static_cast<size_t>(i)];
         k < trie.token_begin[static_cast<size_t>(i) + 1]; ++k)
      SetBit(mask, trie.token_ids[static_cast<size_t>(k)]);
    i = cur.frames.empty() ? trie.subtree_end[static_cast<size_t>(i)] : i + 1;
  }
  return visited;
}

}  // namespace

namespace {

// The states after one input from `in`: each frame's top node moves along
// the edges `targets(node, push)` reports (push(to) once per taken edge),
// then the closure.
template <typename Targets>
void StepFrames(const Grammar& g, const GrammarState& in, GrammarState* out, Targets targets) {
  out->frames.clear();
  out->accepting = false;
  std::vector<int32_t>& visited = VisitedScratch();
  visited.clear();
  Closure c(g, out, &visited);
  int32_t buf[Closure::kMaxFrames + 2];
  const std::vector<int32_t>& f = in.frames;
  for (size_t i = 0; i < f.size(); i += static_cast<size_t>(f[i]) + 1) {
    const int32_t len = f[i];
    const int32_t top = f[i + static_cast<size_t>(len)];
    targets(g.nodes()[static_cast<size_t>(top)], [&](int32_t to) {
      std::memcpy(buf, &f[i + 1], sizeof(int32_t) * static_cast<size_t>(len));
      buf[len - 1] = to;
      c.Explore(buf, len);
    });
  }
}

}  // namespace

void GrammarStep(const Grammar& g, const GrammarState& in, uint8_t byte, GrammarState* out) {
  StepFrames(g, in, out, [byte](const GrammarNode& n, auto&& push) {
    for (const GrammarNode::ByteEdge& e : n.bytes)
      if (byte >= e.lo && byte <= e.hi) push(e.to);
  });
}

void GrammarStepToken(const Grammar& g, const GrammarState& in, int32_t token, GrammarState* out) {
  StepFrames(g, in, out, [token](const GrammarNode& n, auto&& push) {
    for (const GrammarNode::TokenEdge& e : n.tokens)
      if (e.id == token) push(e.to);
  });
}

GrammarState GrammarStart(const Grammar& g) {
  GrammarState s;
  std::vector<int32_t>& visited = VisitedScratch();
  visited.clear();
  Closure c(g, &s, &visited);
  const int32_t root = g.root();
  c.Explore(&root, 1);
  return s;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), state_(GrammarStart(*grammar_)) {}

void GrammarMatcher::FillMask(std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  last_walked_ = 0;
  if (state_.frames.empty()) return;
  thread_local std::vector<int32_t> key;
  CanonicalKey(state_, &key);
  const Grammar& g = *grammar_;
  if (auto cached = g.FindMask(key)) {
    std::memcpy(mask.data(), cached->data(),
                std::min(mask.size(), cached->size()) * sizeof(uint64_t));
    return;
  }
  const TokenVocabulary& v = g.vocab();
  const int32_t len = state_.frames[0];
  const bool single = static_cast<size_t>(len) + 1 == state_.frames.size();
  const int32_t remaining =
      single ? g.nodes()[static_cast<size_t>(state_.frames.back())].string_remaining : -1;
  if (remaining >= 0) {
    // Inside a string: plain tokens are decided by their length alone.
    const std::vector<int32_t>& by_chars = v.plain_by_chars();
    if (!by_chars.empty() && remaining >= v.plain_chars()[static_cast<size_t>(by_chars.back())]) {
      const std::vector<uint64_t>& pm = v.plain_mask();
      std::memcpy(mask.data(), pm.data(), std::min(mask.size(), pm.size()) * sizeof(uint64_t));
    } else {
      for (int32_t id : by_chars) {
        if (v.plain_chars()[static_cast<size_t>(id)] > remaining) break;
        SetBit(mask, id);
      }
    }
    last_walked_ = WalkTrie(g, v.non_plain(), state_, mask);
  } else {
    last_walked_ = WalkTrie(g, v.all(), state_, mask);
  }
  // Token edges (special tokens) of the stacks' tops.
  const std::vector<int32_t>& f = state_.frames;
  for (size_t i = 0; i < f.size(); i += static_cast<size_t>(f[i]) + 1) {
    const int32_t top = f[i + static_cast<size_t>(f[i])];
    for (const GrammarNode::TokenEdge& e : g.nodes()[static_cast<size_t>(top)].tokens)
      if (static_cast<size_t>(e.id) / 64 < mask.size()) SetBit(mask, e.id);
  }
  // Cache what was costly to compute; cheap masks are recomputed.
  if (last_walked_ > 4096 || remaining >= 0)
    g.StoreMask(key, std::make_shared<std::vector<uint64_t>>(mask.begin(), mask.end()));
}

Status GrammarMatcher::AdvanceBytes(std::string_view bytes) {
  GrammarState cur = state_, next;
  for (char ch : bytes) {
    GrammarStep(*grammar_, cur, static_cast<uint8_t>(ch), &next);
    if (next.empty()) return InvalidArgument("the grammar does not allow this output here");
    std::swap(cur, next);
  }
  state_ = std::move(cur);
  return Status::Ok();
}

Status GrammarMatcher::Advance(int32_t token) {
  if (!grammar_->vocab().has(token)) {
    // A token without bytes moves only along token edges.
    GrammarState next;
    GrammarStepToken(*grammar_, state_, token, &next);
    if (!next.empty()) {
      state_ = std::move(next);
      return Status::Ok();
    }
  }
  if (!grammar_->vocab().has(token))
    return InvalidArgument("token " + std::to_string(token) + " has no bytes in the grammar");
  return AdvanceBytes(grammar_->vocab().bytes(token));
}

}  // namespace agentkv::grammar
