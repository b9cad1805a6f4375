#include "engine/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "engine/backend/sample_draw.h"

namespace agentkv::engine {
namespace {

constexpr uint32_t kPromptBit = 0x80000000u;
constexpr uint32_t kCountMask = 0x7fffffffu;

// Scratch shared by all samplers on one thread (the engine thread samples
// sequences one after another); holding one per sequence would cost ~1 MB
// each for a 150k vocabulary.
struct Scratch {
  std::vector<float> raw;
};
Scratch& ThreadScratch(size_t vocab) {
  thread_local Scratch s;
  if (s.raw.size() < vocab) s.raw.resize(vocab);
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

}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size, std::span<const int32_t> eos_ids)
    : params_(params), vocab_size_(vocab_size) {
  if (params_.grammar) {
    std::vector<int32_t> end(eos_ids.begin(), eos_ids.end());
    end.insert(end.end(), params_.stop_token_ids.begin(), params_.stop_token_ids.end());
    constraint_ = std::make_unique<GrammarConstraint>(
        params_.grammar, std::move(end),
        ReasoningBudget(params_, params_.max_tokens.value_or(std::numeric_limits<int32_t>::max())));
  }
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
  if (constraint_) constraint_->Accept(t);
  CountOutput(t);
}

bool Sampler::AcceptPick(int32_t t) {
  if (constraint_ && !constraint_->TryAccept(t)) return false;
  CountOutput(t);
  return true;
}

void Sampler::CountOutput(int32_t t) {
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

void Sampler::ComputeLogprobs(std::span<const float> logits) {
  // The distribution drawn from: logits / temperature (1 when greedy). The
  // log-sum-exp runs in double over the scaled values, so the result does
  // not depend on the order of the scan.
  const double inv_t = params_.greedy() ? 1.0 : 1.0 / static_cast<double>(params_.temperature);
  float m = -std::numeric_limits<float>::infinity();
  for (float v : logits) m = std::max(m, v);
  const double ms = static_cast<double>(m) * inv_t;
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) * inv_t - ms);
  lse_ = ms + std::log(sum);
  inv_t_ = inv_t;
  // Top-N by insertion into a small sorted array of raw logits (scaling by a
  // positive factor keeps the order); scanning ids in ascending order with a
  // strict comparison keeps the lowest id on ties.
  const int32_t want = std::min<int32_t>(*params_.logprobs, vocab_size_);
  num_top_ = 0;
  for (int32_t i = 0; i < vocab_size_ && want > 0; ++i) {
    const float v = logits[static_cast<size_t>(i)];
    // A masked token (a grammar's, -inf) has no probability: it is never
    // among the most likely, and its logprob would not survive JSON.
    if (!(v > -std::numeric_limits<float>::infinity())) continue;
    if (num_top_ == want && !(v > top_[static_cast<size_t>(want - 1)].logprob)) continue;
    int32_t pos = num_top_ < want ? num_top_++ : want - 1;
    while (pos > 0 && v > top_[static_cast<size_t>(pos - 1)].logprob) {
      top_[static_cast<size_t>(pos)] = top_[static_cast<size_t>(pos - 1)];
      --pos;
    }
    top_[static_cast<size_t>(pos)] = {i, v};
  }
  for (int32_t i = 0; i < num_top_; ++i) {
    TokenLogprob& t = top_[static_cast<size_t>(i)];
    t.logprob = LogprobOf(t.logprob);
  }
}

float Sampler::LogprobOf(float logit) const {
  return static_cast<float>(static_cast<double>(logit) * inv_t_ - lse_);
}

SampledToken Sampler::Sample(std::span<float> logits) {
  assert(logits.size() == static_cast<size_t>(vocab_size_));
  if (constraint_ && params_.greedy() && !params_.logprobs && counts_.empty()) {
    // Greedy under a grammar alone: the argmax of the allowed entries, the
    // token masking first gives, without writing the row.
    SampledToken out;
    out.token = constraint_->AllowedArgmax(logits);
    AddOutput(out.token);
    return out;
  }
  // A grammar's mask first: penalties, logprobs and the draw see only
  // the tokens it allows.
  if (constraint_) constraint_->Apply(logits);
  ApplyPenalties(logits);
  float chosen_logit = 0.0f;
  if (params_.logprobs) ComputeLogprobs(logits);
  int32_t token;
  if (params_.greedy()) {
    token = Argmax(logits);
    chosen_logit = logits[static_cast<size_t>(token)];
  } else if (params_.logprobs) {
    // SampleDraw clobbers the row: draw from a copy, read the logit after.
    Scratch& s = ThreadScratch(logits.size());
    std::memcpy(s.raw.data(), logits.data(), logits.size() * sizeof(float));
    token = backend::SampleDraw(std::span<float>(s.raw.data(), logits.size()), NextDraw());
    chosen_logit = logits[static_cast<size_t>(token)];
  } else {
    token = backend::SampleDraw(logits, NextDraw());
  }
  AddOutput(token);

  SampledToken out;
  out.token = token;
  if (params_.logprobs) {
    out.logprob = LogprobOf(chosen_logit);
    out.top_logprobs = std::span<const TokenLogprob>(top_.data(), static_cast<size_t>(num_top_));
  }
  return out;
}

SampledToken Sampler::SampleOptimistic(std::span<float> logits) {
  assert(logits.size() == static_cast<size_t>(vocab_size_));
  if (params_.greedy() || !constraint_) return Sample(logits);
  Scratch& s = ThreadScratch(logits.size());
  std::memcpy(s.raw.data(), logits.data(), logits.size() * sizeof(float));
  const int32_t token =
      backend::SampleDraw(std::span<float>(s.raw.data(), logits.size()), NextDraw());
  if (!AcceptPick(token)) return Sample(logits);
  SampledToken out;
  out.token = token;
  return out;
}

backend::SampleSettings Sampler::NextDraw() {
  backend::SampleSettings d;
  d.temperature = params_.temperature;
  d.top_k = params_.top_k;
  d.top_p = params_.top_p;
  d.min_p = params_.min_p;
  d.u = NextUniform();
  return d;
}

}  // namespace agentkv::engine
