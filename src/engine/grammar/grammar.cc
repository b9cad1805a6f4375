#include "engine/grammar/grammar.h"

#include <algorithm>

namespace agentkv::grammar {

size_t Grammar::KeyHash::operator()(const std::vector<int32_t>& k) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t v : k) {
    h ^= static_cast<uint32_t>(v);
    h *= 0x100000001b3ull;
  }
  return static_cast<size_t>(h);
}

std::shared_ptr<const std::vector<uint64_t>> Grammar::FindMask(
    const std::vector<int32_t>& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

void Grammar::StoreMask(const std::vector<int32_t>& key,
                        std::shared_ptr<const std::vector<uint64_t>> mask) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  cache_.emplace(key, std::move(mask));
}

int32_t GrammarBuilder::NewNode() {
  if (static_cast<int32_t>(nodes_.size()) >= limits_.max_nodes) {
    if (status_.ok())
      status_ = InvalidArgument("the schema compiles to more than " +
                                std::to_string(limits_.max_nodes) + " grammar states");
    return 0;  // callers keep going; Finish() reports the error
  }
  nodes_.emplace_back();
  return static_cast<int32_t>(nodes_.size() - 1);
}

void GrammarBuilder::AddBytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
  if (!status_.ok()) return;
  nodes_[static_cast<size_t>(from)].bytes.push_back({lo, hi, to});
}

void GrammarBuilder::AddEps(int32_t from, int32_t to) {
  if (!status_.ok() || from == to) return;
  nodes_[static_cast<size_t>(from)].eps.push_back(to);
}

void GrammarBuilder::AddCall(int32_t from, int32_t start, int32_t ret) {
  if (!status_.ok()) return;
  nodes_[static_cast<size_t>(from)].calls.push_back({start, ret});
}

void GrammarBuilder::AddToken(int32_t from, int32_t id, int32_t to) {
  if (!status_.ok()) return;
  nodes_[static_cast<size_t>(from)].tokens.push_back({id, to});
}

int32_t GrammarBuilder::Splice(const Grammar& g) {
  if (!status_.ok()) return 0;
  const auto base = static_cast<int32_t>(nodes_.size());
  const auto n = static_cast<int32_t>(g.nodes().size());
  if (base + n > limits_.max_nodes) {
    status_ = InvalidArgument("the schema compiles to more than " +
                              std::to_string(limits_.max_nodes) + " grammar states");
    return 0;
  }
  for (const GrammarNode& src : g.nodes()) {
    GrammarNode d = src;
    for (auto& e : d.bytes) e.to += base;
    for (auto& e : d.tokens) e.to += base;
    for (int32_t& e : d.eps) e += base;
    for (auto& c : d.calls) {
      c.start += base;
      c.ret += base;
    }
    nodes_.push_back(std::move(d));
  }
  return g.root() + base;
}

void GrammarBuilder::MarkEnd(int32_t node) {
  if (!status_.ok()) return;
  nodes_[static_cast<size_t>(node)].end = true;
}

void GrammarBuilder::SetStringRemaining(int32_t node, int32_t remaining) {
  if (!status_.ok()) return;
  nodes_[static_cast<size_t>(node)].string_remaining = remaining;
}

void GrammarBuilder::AddLiteral(int32_t from, std::string_view text, int32_t to) {
  if (text.empty()) {
    AddEps(from, to);
    return;
  }
  int32_t cur = from;
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t next = i + 1 == text.size() ? to : NewNode();
    AddByte(cur, static_cast<uint8_t>(text[i]), next);
    cur = next;
  }
}

Result<std::shared_ptr<const Grammar>> GrammarBuilder::Finish(
    int32_t root, std::shared_ptr<const TokenVocabulary> vocab) {
  if (!status_.ok()) return status_;
  const int32_t vocab_size = vocab ? vocab->vocab_size() : 0;
  for (const GrammarNode& n : nodes_)
    for (const GrammarNode::TokenEdge& e : n.tokens)
      if (e.id < 0 || e.id >= vocab_size || (vocab && vocab->has(e.id)))
        return InvalidArgument("token " + std::to_string(e.id) +
                               " cannot be a grammar's token edge (out of the vocabulary, or "
                               "a token with bytes)");
  auto g = std::make_shared<Grammar>();
  g->nodes_ = std::move(nodes_);
  g->root_ = root;
  g->limits_ = limits_;
  // The matcher's frame buffer holds at most 256 frames.
  g->limits_.max_stack_depth = std::min(g->limits_.max_stack_depth, 256);
  g->vocab_ = std::move(vocab);
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace agentkv::grammar
