#include "engine/grammar_constraint.h"

#include <algorithm>
#include <limits>

namespace agentkv::engine {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const grammar::Grammar> grammar,
                                     std::vector<int32_t> end_ids, int32_t reasoning_budget)
    : matcher_(std::move(grammar)),
      end_ids_(std::move(end_ids)),
      reasoning_budget_(reasoning_budget) {
  if (reasoning_budget_ == 0) matcher_.CloseReasoning();
}

void GrammarConstraint::Apply(std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  // Per thread: the engine's sampling threads each mask one row at a time.
  thread_local std::vector<uint64_t> mask;
  mask.assign((n + 63) / 64, 0);
  const size_t vocab_words =
      (static_cast<size_t>(matcher_.grammar().vocab().vocab_size()) + 63) / 64;
  matcher_.FillMask(std::span<uint64_t>(mask.data(), std::min(mask.size(), vocab_words)));
  bool any = false;
  for (uint64_t w : mask) any = any || w != 0;
  const bool end_ok = matcher_.accepting() || !any;
  for (int32_t id : end_ids_)
    if (id >= 0 && static_cast<size_t>(id) < n && end_ok)
      mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  for (size_t w = 0; w < mask.size(); ++w) {
    const uint64_t bits = mask[w];
    if (bits == ~uint64_t{0}) continue;
    const size_t base = w * 64, end = std::min(n, base + 64);
    if (bits == 0) {
      std::fill(logits.begin() + static_cast<long>(base), logits.begin() + static_cast<long>(end),
                kNegInf);
      continue;
    }
    for (size_t i = base; i < end; ++i)
      if (!((bits >> (i - base)) & 1)) logits[i] = kNegInf;
  }
}

void GrammarConstraint::Accept(int32_t token) { (void)TryAccept(token); }

bool GrammarConstraint::TryAccept(int32_t token) {
  if (std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end())
    return matcher_.accepting();
  const bool reasoning = reasoning_budget_ >= 0 && matcher_.in_reasoning();
  // A disallowed token leaves the state unchanged.
  if (!matcher_.Advance(token).ok()) return false;
  if (reasoning) ++reasoning_tokens_;
  if (reasoning_budget_ >= 0 && reasoning_tokens_ >= reasoning_budget_) matcher_.CloseReasoning();
  return true;
}

}  // namespace agentkv::engine
