#include "engine/backend/sample_draw.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace agentkv::backend {
namespace {

struct Candidate {
  float value;  // the unnormalized probability
  int32_t id;
};

// Larger weight first; lowest id on ties, so selection is a total order and
// the result does not depend on the standard library's algorithm.
inline bool Before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// Holding the scratch per thread, not per sequence: ~1 MB for a 150k
// vocabulary.
std::vector<Candidate>& ThreadCandidates(size_t vocab) {
  thread_local std::vector<Candidate> cand;
  if (cand.size() < vocab) cand.resize(vocab);
  return cand;
}

int32_t Argmax(std::span<const float> v) {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] > best_v) {  // strict: the lowest id wins ties; NaN never wins
      best_v = v[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// The last candidate (in Before order) of the shortest prefix whose weights
// sum to at least `target`: a quickselect on mass, O(n) expected, no sort.
// Reorders cand[0..n).
Candidate NucleusBoundary(Candidate* cand, size_t n, double target) {
  size_t lo = 0, hi = n;
  double need = target;
  Candidate last = cand[0];
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    // Median of three as pivot.
    Candidate a = cand[lo], b = cand[mid], c = cand[hi - 1];
    if (Before(b, a)) std::swap(a, b);
    if (Before(c, b)) std::swap(b, c);
    if (Before(b, a)) std::swap(a, b);
    const Candidate pivot = b;
    Candidate* p =
        std::partition(cand + lo, cand + hi, [&](const Candidate& x) { return Before(x, pivot); });
    double before = 0.0;
    for (Candidate* it = cand + lo; it != p; ++it) before += it->value;
    if (p != cand + lo && before >= need) {
      hi = static_cast<size_t>(p - cand);
      continue;
    }
    last = pivot;
    if (before + pivot.value >= need) return pivot;
    need -= before + pivot.value;
    // Put the pivot first in the after-part and step past it.
    Candidate* q = std::find_if(p, cand + hi, [&](const Candidate& x) { return x.id == pivot.id; });
    std::swap(*p, *q);
    lo = static_cast<size_t>(p - cand) + 1;
  }
  return last;  // rounding: the whole set is the nucleus
}

}  // namespace

namespace {

// SampleWeights; `kept_mass` receives the kept weights' sum (double, in id
// order).
int32_t KeepWeights(std::span<float> logits, const SampleSettings& s, double* kept_mass) {
  const size_t vocab = logits.size();
  const float inv_t = 1.0f / s.temperature;
  const int32_t best = Argmax(logits);
  const float m = logits[static_cast<size_t>(best)];
  if (!std::isfinite(m)) return best;

  // From here on logits[i] holds token i's unnormalized probability; the
  // best token's is exactly 1. Orders below are by (weight desc, id asc).
  double total = 0.0;
  for (float& v : logits) {
    // A masked entry (a grammar's -inf) weighs exactly 0, as its exp would:
    // skipping the exp changes no weight and no sum.
    if (v == -std::numeric_limits<float>::infinity()) {
      v = 0.0f;
      continue;
    }
    // Float exp: about 3x cheaper than double over a 150k vocabulary, and
    // exact enough for drawing.
    float w = std::exp((v - m) * inv_t);
    if (std::isnan(w)) w = 0.0f;
    v = w;
    total += w;
  }

  // Tokens ordered at or before `boundary` survive top_k / top_p.
  bool bounded = false;
  Candidate boundary{0.0f, 0};
  const bool use_top_k = s.top_k > 0 && static_cast<size_t>(s.top_k) < vocab;
  const bool use_top_p = s.top_p < 1.0f;
  if (use_top_k || use_top_p) {
    Candidate* cand = ThreadCandidates(vocab).data();
    size_t n = 0;
    if (use_top_k) {
      n = static_cast<size_t>(s.top_k);
      // A heap of the n best so far, worst on top: one cheap comparison per
      // token for the usual small k, instead of a selection over the vocab.
      auto worse_on_top = [](const Candidate& a, const Candidate& b) { return Before(a, b); };
      size_t size = 0;
      for (size_t i = 0; i < vocab; ++i) {
        const Candidate c{logits[i], static_cast<int32_t>(i)};
        if (size < n) {
          cand[size++] = c;
          std::push_heap(cand, cand + size, worse_on_top);
        } else if (Before(c, cand[0])) {
          std::pop_heap(cand, cand + size, worse_on_top);
          cand[size - 1] = c;
          std::push_heap(cand, cand + size, worse_on_top);
        }
      }
      boundary = cand[0];
      bounded = true;
      total = 0.0;
      for (size_t i = 0; i < n; ++i) total += cand[i].value;
    } else {
      // The nucleus is usually a few hundred tokens: collect those above a
      // weight threshold, lowering it until they hold top_p of the mass.
      for (float threshold : {1e-3f, 1e-6f, 0.0f}) {
        n = 0;
        double mass = 0.0;
        for (size_t i = 0; i < vocab; ++i) {
          if (logits[i] >= threshold) {
            cand[n++] = {logits[i], static_cast<int32_t>(i)};
            mass += logits[i];
          }
        }
        if (mass >= s.top_p * total) break;
      }
    }
    if (use_top_p) {
      boundary = NucleusBoundary(cand, n, s.top_p * total);
      bounded = true;
    }
  }

  // min_p relative to the best token, whose weight is 1.
  const float cut = s.min_p;
  auto keep = [&](size_t i) {
    const float w = logits[i];
    if (w <= 0.0f || w < cut) return false;
    return !bounded || w > boundary.value ||
           (w == boundary.value && static_cast<int32_t>(i) <= boundary.id);
  };
  bool any = false;
  double mass = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    if (keep(i)) {
      any = true;
      mass += logits[i];
    } else {
      logits[i] = 0.0f;
    }
  }
  *kept_mass = mass;
  return any ? -1 : best;  // nothing kept (1 / T overflowed): the argmax
}

int32_t Draw(std::span<const float> weights, double u01, double mass) {
  // Drawing by scanning ids in order makes the result independent of the
  // order selection left the candidates in (and a GPU can do it as a prefix
  // sum).
  double u = u01 * mass;
  int32_t last = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0.0f)) continue;
    last = static_cast<int32_t>(i);
    u -= weights[i];
    if (u < 0.0) return last;
  }
  return last;  // rounding left u a hair above zero (-1: nothing kept)
}

}  // namespace

int32_t SampleWeights(std::span<float> logits, const SampleSettings& s) {
  double mass = 0.0;
  return KeepWeights(logits, s, &mass);
}

int32_t DrawFromWeights(std::span<const float> weights, double u) {
  double mass = 0.0;
  for (float w : weights)
    if (w > 0.0f) mass += w;
  return Draw(weights, u, mass);
}

int32_t SampleDraw(std::span<float> logits, const SampleSettings& s) {
  double mass = 0.0;
  const int32_t point = KeepWeights(logits, s, &mass);
  if (point >= 0) return point;
  return Draw(logits, s.u, mass);
}

int32_t VerifyDraftRow(std::span<float> logits, const SampleSettings& s, int32_t draft,
                       double u_accept) {
  double mass = 0.0;
  const int32_t point = KeepWeights(logits, s, &mass);
  if (point >= 0) return point;  // accepted iff it is the draft
  const bool in_vocab = draft >= 0 && static_cast<size_t>(draft) < logits.size();
  const double p = in_vocab ? logits[static_cast<size_t>(draft)] / mass : 0.0;
  if (u_accept < p) return draft;
  // Rejected: the residual is p without the draft token, its mass summed
  // afresh (mass - w(draft) would cancel where the draft held nearly all).
  if (in_vocab) logits[static_cast<size_t>(draft)] = 0.0f;
  const int32_t t = DrawFromWeights(logits, s.u);
  // Nothing left: only the draft was kept, so p was 1 and it was accepted;
  // rounding alone gets here.
  return t >= 0 ? t : draft;
}

int32_t PickDeviceRow(std::span<float> logits, const RowPick& pick) {
  return pick.draft >= 0 ? VerifyDraftRow(logits, pick.sample, pick.draft, pick.u_accept)
                         : SampleDraw(logits, pick.sample);
}

}  // namespace agentkv::backend
