// SamplingParams: how one sequence picks its next token and when it stops.
// Plain value type; copy freely. Ranges follow the OpenAI API (temperature
// 0..2, penalties -2..2) and vLLM (top_k, min_p, repetition_penalty).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace agentkv::grammar {
class Grammar;  // engine/grammar/grammar.h
}  // namespace agentkv::grammar

namespace agentkv::engine {

// Stop strings are matched against every generated piece of every sequence
// on the engine thread, so a request's stop list is bounded: at most this
// many, each at most this many bytes.
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 512;
inline constexpr size_t kMaxStopTokenIds = 64;

// One token and its log-probability (SamplingParams::logprobs).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SamplingParams {
  // Most top logprobs a request may ask for (OpenAI's top_logprobs limit).
  static constexpr int kMaxLogprobs = 20;

  float temperature = 1.0f;  // 0 = greedy (argmax)
  float top_p = 1.0f;        // (0, 1]; 1 = off
  int32_t top_k = 0;         // 0 or -1 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off
  // Unset: the sampler draws a seed of its own, so runs differ.
  std::optional<uint64_t> seed;
  // HF/vLLM: logits of tokens seen in prompt or output are divided (if
  // positive) or multiplied (if negative) by this. 1 = off.
  float repetition_penalty = 1.0f;
  // OpenAI, over output tokens only: logit -= presence * (count > 0) +
  // frequency * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Unset: until the context is full (the caller clamps it to what is left).
  std::optional<int32_t> max_tokens;
  std::vector<std::string> stop;        // stop strings, excluded from the output
  std::vector<int32_t> stop_token_ids;  // stop even when ignore_eos is set
  bool ignore_eos = false;
  // Speculative decoding (EngineOptions::speculative) may draft for this
  // request; false opts it out. The output is the same either way (greedy
  // identical, sampled from the same distribution); only its speed differs.
  bool speculative = true;
  // Unset: no logprobs. N: the sampled token's logprob plus the N most likely
  // tokens' (0..kMaxLogprobs). The distribution is the one the sampler
  // draws from before truncation (as OpenAI documents it): log-softmax of
  // the logits after the penalties, divided by the temperature (by 1 when
  // greedy); top_k / top_p / min_p do not change it.
  std::optional<int32_t> logprobs;
  // Constrained decoding: when set, every token keeps the output a prefix
  // of a match of this grammar and the sequence stops (EOS) only where the
  // output is a complete match (the Sampler holds the per-sequence state).
  // Shared and immutable; requires !ignore_eos.
  std::shared_ptr<const grammar::Grammar> grammar;

  bool greedy() const { return temperature == 0.0f; }
  bool top_k_enabled() const { return top_k > 0; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }

  // InvalidArgument naming the first field out of range; NaN is out of range.
  Status Validate() const;
};

}  // namespace agentkv::engine
