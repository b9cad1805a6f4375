#include "engine/grammar_constraint.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace agentkv::engine {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const grammar::Grammar> grammar,
                                     std::vector<int32_t> end_ids, int32_t reasoning_budget)
    : matcher_(std::move(grammar)),
      end_ids_(std::move(end_ids)),
      reasoning_budget_(reasoning_budget) {
  if (reasoning_budget_ == 0) matcher_.CloseReasoning();
}

const std::vector<uint64_t>& GrammarConstraint::Mask(size_t n) {
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
  // (Bits at or past n, a grammar over a longer vocabulary's, are ignored
  // by the callers.)
  return mask;
}

void GrammarConstraint::Apply(std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  const std::vector<uint64_t>& mask = Mask(n);
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

int32_t GrammarConstraint::AllowedArgmax(std::span<const float> logits) {
  const size_t n = logits.size();
  const std::vector<uint64_t>& mask = Mask(n);
  // Ids ascending with a strict comparison, as Argmax over the masked row:
  // the masked entries (-inf there) never win, so skipping them changes
  // nothing.
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < mask.size(); ++w) {
    uint64_t bits = mask[w];
    const size_t base = w * 64;
    if (bits == ~uint64_t{0} && base + 64 <= n) {
      for (size_t i = base; i < base + 64; ++i) {
        if (logits[i] > best_v) {
          best_v = logits[i];
          best = static_cast<int32_t>(i);
        }
      }
      continue;
    }
    while (bits != 0) {
      const size_t i = base + static_cast<size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      if (i >= n) break;
      if (logits[i] > best_v) {
        best_v = logits[i];
        best = static_cast<int32_t>(i);
      }
    }
  }
  return best;
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
