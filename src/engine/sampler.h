// Sampler: turns one sequence's final-position logits into its next token,
// following that sequence's SamplingParams. Each sequence in a batch owns one
// Sampler, so sequences sample independently with their own settings and RNG.
//
// Order of operations (as Hugging Face and vLLM): repetition penalty ->
// presence/frequency penalties -> temperature -> top_k -> top_p -> min_p ->
// draw; the steps after the penalties are SampleDraw (engine/backend/sample_draw.h,
// which defines them exactly). Greedy (temperature 0) is argmax after
// penalties, lowest id on ties. Seeded sampling uses a private xoshiro256**
// generator, so the same seed and logits give the same tokens on every run
// and machine.
//
// Rows sampled elsewhere: a sequence whose params need no penalties and no
// logprobs (ChoosePickMode == kDevice) may be drawn by the backend, where
// the logits are. NextDraw() then gives the backend the settings and the
// uniform u, drawn from this Sampler's generator exactly as Sample() would
// draw it (one u per sampled token, in token order), and the caller records
// the token the backend picked with AddOutput(). Both ways give the same
// tokens for the same seed and logits (up to the CPU / GPU rounding
// SampleDraw describes).
//
// Thread-safety: none; one thread uses a Sampler at a time (the engine
// thread). Sample() allocates nothing after the first call on a thread: the
// candidate scratch is per thread and sized to the vocabulary once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/backend/row_pick.h"
#include "engine/grammar_constraint.h"
#include "engine/sampling_params.h"

namespace agentkv::engine {

struct SampledToken {
  int32_t token = 0;
  // Log-probability of `token` under the distribution SamplingParams::logprobs
  // defines (after penalties and temperature, before top_k / top_p / min_p);
  // set only when params.logprobs is set.
  std::optional<float> logprob;
  // The params.logprobs most likely tokens, most likely first (lowest id on
  // ties). Points into the Sampler; valid until its next Sample().
  std::span<const TokenLogprob> top_logprobs;
};

class Sampler {
 public:
  // `params` must have passed Validate(). `vocab_size` is the logits' length.
  // `eos_ids`: the model's end-of-sequence ids, which a params.grammar
  // allows only where the output is complete (GrammarConstraint), with the
  // reasoning budget ReasoningBudget(params, params.max_tokens) (the engine
  // passes max_tokens as it clamped it).
  Sampler(const SamplingParams& params, int32_t vocab_size, std::span<const int32_t> eos_ids = {});

  // Records prompt tokens for the repetition penalty. Cheap no-op when no
  // penalty is set. Ids outside the vocabulary are ignored.
  void AddPrompt(std::span<const int32_t> tokens);
  // Records an output token that this Sampler did not pick (output restored
  // after a restart, forced tokens), so penalties (and the grammar) see it.
  void AddOutput(int32_t token);

  // The settings and a fresh uniform for one token drawn outside this
  // Sampler (SampleDraw, or a backend doing the same on its device); advances
  // the generator as one Sample() of a sampled row does. Requires
  // temperature > 0.
  backend::SampleSettings NextDraw();

  // The optimistic pick of a constrained row (OptimisticGrammarPick): the
  // backend picked `token` from the unmasked row. When the grammar allows
  // it, records it as output (as AddOutput) and returns true: that is the
  // pick. Else returns false and changes nothing: the caller picks with
  // Sample() from the same row (which masks it, and draws a fresh uniform
  // for a sampled row). Without a grammar: AddOutput, true.
  bool AcceptPick(int32_t token);
  // The optimistic pick made on the host, for a row that OptimisticGrammarPick
  // allows but the backend did not pick (a backend that keeps no logits
  // rows, or one whose picks run on the host): a draw from a copy of the
  // unmasked row with the next uniform, as the backend's draw, kept when
  // AcceptPick allows it, else Sample(). So a seeded request gets the same
  // tokens whichever way its rows are picked. Greedy: Sample() (the same
  // token either way).
  SampledToken SampleOptimistic(std::span<float> logits);

  // Picks the next token and records it as output. `logits` (vocab_size
  // long) is used as scratch and left clobbered. With params.grammar, the
  // disallowed tokens are masked (-inf) first.
  SampledToken Sample(std::span<float> logits);

  // The penalty step of Sample(), in place. O(distinct tokens seen).
  void ApplyPenalties(std::span<float> logits) const;

  // The generator's state, to replay draws: a pipelined step's uniform
  // drawn for a token that was rolled back is drawn again
  // (Engine, a rejected optimistic pick).
  using RngState = std::array<uint64_t, 4>;
  RngState rng_state() const { return rng_; }
  void set_rng_state(const RngState& state) { rng_ = state; }
  const SamplingParams& params() const { return params_; }
  int32_t vocab_size() const { return vocab_size_; }
  // The seed in use: params.seed, or the one drawn when it was unset.
  uint64_t seed() const { return seed_; }

 private:
  // Log-sum-exp and top-N of the penalized `logits` scaled by 1/temperature.
  void ComputeLogprobs(std::span<const float> logits);
  float LogprobOf(float logit) const;  // after ComputeLogprobs
  void CountOutput(int32_t token);     // the penalties' count of an output token
  double NextUniform();                // [0, 1), 53 random bits
  uint64_t NextU64();

  SamplingParams params_;
  int32_t vocab_size_;
  uint64_t seed_;
  std::array<uint64_t, 4> rng_{};
  // Per token id: bit 31 = seen in the prompt, bits 0..30 = output count.
  // Empty when no penalty is set.
  std::vector<uint32_t> counts_;
  std::vector<int32_t> seen_ids_;                  // ids with a non-zero counts_ entry
  std::unique_ptr<GrammarConstraint> constraint_;  // params.grammar set
  std::array<TokenLogprob, SamplingParams::kMaxLogprobs> top_{};
  int32_t num_top_ = 0;
  double lse_ = 0.0;    // log-sum-exp of the scaled logits of the last row
  double inv_t_ = 1.0;  // 1 / temperature (1 when greedy)
};

}  // namespace agentkv::engine
