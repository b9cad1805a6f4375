#include "engine/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace agentkv {
namespace {

constexpr uint32_t kPromptBit = 0x80000000u;
constexpr uint32_t kCountMask = 0x7fffffffu;

struct Candidate {
  float value;  // logit, later the unnormalized probability
  int32_t id;
};

// Larger logit first; lowest id on ties, so selection is a total order and
// the result does not depend on the standard library's algorithm.
inline bool Before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

// Scratch shared by all samplers on one thread (the engine thread samples
// sequences one after another); holding one per sequence would cost ~1 MB
// each for a 150k vocabulary.
struct Scratch {
  std::vector<Candidate> cand;
  std::vector<float> raw;
};
Scratch& ThreadScratch(size_t vocab) {
  thread_local Scratch s;
  if (s.cand.size() < vocab) {
    s.cand.resize(vocab);
    s.raw.resize(vocab);
  }
  return s;
}

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

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

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size)
    : params_(params), vocab_size_(vocab_size) {
  assert(vocab_size > 0);
  if (params_.seed) {
    seed_ = *params_.seed;
  } else {
    std::random_device rd;
    seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  uint64_t x = seed_;
  for (uint64_t& s : rng_) s = SplitMix64(x);
  if (params_.has_penalties()) {
    counts_.assign(static_cast<size_t>(vocab_size), 0);
    seen_ids_.reserve(std::min<size_t>(static_cast<size_t>(vocab_size), 16384));
  }
}

uint64_t Sampler::NextU64() {
  // xoshiro256**
  const uint64_t result = Rotl(rng_[1] * 5, 7) * 9;
  const uint64_t t = rng_[1] << 17;
  rng_[2] ^= rng_[0];
  rng_[3] ^= rng_[1];
  rng_[1] ^= rng_[2];
  rng_[0] ^= rng_[3];
  rng_[2] ^= t;
  rng_[3] = Rotl(rng_[3], 45);
  return result;
}

double Sampler::NextUniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

void Sampler::AddPrompt(std::span<const int32_t> tokens) {
  if (counts_.empty()) return;
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab_size_) continue;
    uint32_t& c = counts_[static_cast<size_t>(t)];
    if (c == 0) seen_ids_.push_back(t);
    c |= kPromptBit;
  }
}

void Sampler::AddOutput(int32_t t) {
  if (counts_.empty() || t < 0 || t >= vocab_size_) return;
  uint32_t& c = counts_[static_cast<size_t>(t)];
  if (c == 0) seen_ids_.push_back(t);
  if ((c & kCountMask) != kCountMask) ++c;
}

void Sampler::ApplyPenalties(std::span<float> logits) const {
  if (counts_.empty()) return;
  assert(logits.size() == static_cast<size_t>(vocab_size_));
  const float rep = params_.repetition_penalty;
  const float pres = params_.presence_penalty;
  const float freq = params_.frequency_penalty;
  for (int32_t id : seen_ids_) {
    const uint32_t c = counts_[static_cast<size_t>(id)];
    float l = logits[static_cast<size_t>(id)];
    if (rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
    const uint32_t n = c & kCountMask;
    if (n > 0) l -= freq * static_cast<float>(n) + pres;
    logits[static_cast<size_t>(id)] = l;
  }
}

void Sampler::ComputeLogprobs(std::span<const float> raw) {
  float m = -std::numeric_limits<float>::infinity();
  for (float v : raw) m = std::max(m, v);
  double sum = 0.0;
  for (float v : raw) sum += std::exp(static_cast<double>(v) - m);
  const double lse = m + std::log(sum);
  // Top-N by insertion into a small sorted array; scanning ids in ascending
  // order with a strict comparison keeps the lowest id on ties.
  const int32_t want = std::min<int32_t>(*params_.logprobs, vocab_size_);
  num_top_ = 0;
  for (int32_t i = 0; i < vocab_size_ && want > 0; ++i) {
    const float v = raw[static_cast<size_t>(i)];
    if (num_top_ == want && !(v > top_[static_cast<size_t>(want - 1)].logprob)) continue;
    int32_t pos = num_top_ < want ? num_top_++ : want - 1;
    while (pos > 0 && v > top_[static_cast<size_t>(pos - 1)].logprob) {
      top_[static_cast<size_t>(pos)] = top_[static_cast<size_t>(pos - 1)];
      --pos;
    }
    top_[static_cast<size_t>(pos)] = {i, v};
  }
  for (int32_t i = 0; i < num_top_; ++i) {
    top_[static_cast<size_t>(i)].logprob =
        static_cast<float>(top_[static_cast<size_t>(i)].logprob - lse);
  }
  sampled_logprob_ = static_cast<float>(lse);  // finished once the token is known
}

SampledToken Sampler::Sample(std::span<float> logits) {
  assert(logits.size() == static_cast<size_t>(vocab_size_));
  std::span<const float> raw;
  if (params_.logprobs) {
    Scratch& s = ThreadScratch(logits.size());
    std::memcpy(s.raw.data(), logits.data(), logits.size() * sizeof(float));
    raw = std::span<const float>(s.raw.data(), logits.size());
    ComputeLogprobs(raw);
  }
  ApplyPenalties(logits);
  const int32_t token = params_.greedy() ? Argmax(logits) : SampleStochastic(logits);
  AddOutput(token);

  SampledToken out;
  out.token = token;
  if (params_.logprobs) {
    out.logprob = raw[static_cast<size_t>(token)] - sampled_logprob_;
    out.top_logprobs = std::span<const TokenLogprob>(top_.data(), static_cast<size_t>(num_top_));
  }
  return out;
}

int32_t Sampler::SampleStochastic(std::span<float> logits) {
  const size_t vocab = logits.size();
  const float inv_t = 1.0f / params_.temperature;
  float m = -std::numeric_limits<float>::infinity();
  for (float v : logits) m = std::max(m, v);
  if (!std::isfinite(m)) return Argmax(logits);

  // From here on logits[i] holds token i's unnormalized probability; the
  // best token's is exactly 1. Orders below are by (weight desc, id asc).
  double total = 0.0;
  for (float& v : logits) {
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
  const bool use_top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab;
  const bool use_top_p = params_.top_p < 1.0f;
  if (use_top_k || use_top_p) {
    Scratch& s = ThreadScratch(vocab);
    Candidate* cand = s.cand.data();
    size_t n = 0;
    if (use_top_k) {
      n = static_cast<size_t>(params_.top_k);
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
        if (mass >= params_.top_p * total) break;
      }
    }
    if (use_top_p) {
      boundary = NucleusBoundary(cand, n, params_.top_p * total);
      bounded = true;
    }
  }

  // min_p relative to the best token, whose weight is 1.
  const float cut = params_.min_p;
  auto keep = [&](size_t i) {
    const float w = logits[i];
    if (w <= 0.0f || w < cut) return false;
    return !bounded || w > boundary.value ||
           (w == boundary.value && static_cast<int32_t>(i) <= boundary.id);
  };
  // Drawing by scanning ids in order makes the result independent of the
  // order selection left the candidates in.
  double mass = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    if (keep(i)) mass += logits[i];
  }
  double u = NextUniform() * mass;
  int32_t last = Argmax(logits);
  for (size_t i = 0; i < vocab; ++i) {
    if (!keep(i)) continue;
    last = static_cast<int32_t>(i);
    u -= logits[i];
    if (u < 0.0) return last;
  }
  return last;  // rounding left u a hair above zero
}

}  // namespace agentkv
