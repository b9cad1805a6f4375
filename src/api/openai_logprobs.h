// OpenAiLogprobs: the OpenAI shapes of per-token logprobs and the request
// fields that ask for them and for several choices.
//
// Chat (`logprobs: true`, `top_logprobs: 0..20`): `choices[].logprobs` is
// {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
// "logprob", "bytes"}]}], "refusal": null}. Completions (`logprobs: N`,
// 0..20): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
// "text_offset"}, where each top_logprobs entry holds the N most likely
// tokens plus the sampled one (so up to N + 1, as OpenAI documents), and
// text_offset counts Unicode code points from the start of the choice's
// text. A token's string is the tokenizer's decoding of that token alone
// (a piece of a UTF-8 character comes out as U+FFFD); its bytes are the
// exact bytes it stands for (Tokenizer::TokenBytes; the string's bytes
// where the tokenizer cannot say).
//
// The values are SamplingParams::logprobs's: log-softmax of the logits the
// sampler saw after penalties and temperature.
//
// Thread-safety: pure functions, except that Builder is a plain value owned
// by one job.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "engine/request.h"
#include "engine/text/tokenizer.h"
#include "util/status.h"

namespace agentkv::api {

// Most choices one request may ask for (`n`).
inline constexpr int kMaxChoices = 16;

// `n`: absent or null is 1; an integer in 1..kMaxChoices, else
// InvalidArgument naming it.
Result<int> ParseChoiceCount(const nlohmann::json& body);

// The SamplingParams::logprobs a request asks for, or nullopt for none.
// Chat: `logprobs` (boolean) and `top_logprobs` (0..20, only with
// `logprobs: true`). Completions: `logprobs` (integer 0..20). Null means
// absent. InvalidArgument naming the field otherwise.
Result<std::optional<int32_t>> ParseLogprobs(const nlohmann::json& body, bool chat);

class OpenAiLogprobs {
 public:
  // `tokenizer` must outlive the builder.
  OpenAiLogprobs(const text::Tokenizer* tokenizer, bool chat)
      : tokenizer_(tokenizer), chat_(chat) {}

  // The entries for `tokens` (one OutputLogprobs each, as RequestOutput
  // carries them), in this builder's shape: a chat "content" array, or a
  // completions object of four parallel arrays. Advances the text offset.
  nlohmann::json Entries(std::span<const int32_t> tokens,
                         std::span<const engine::OutputLogprobs> lps);
  // Appends `entries` (from Entries) to `all`, which starts as null.
  void Append(const nlohmann::json& entries, nlohmann::json* all) const;
  // The choice's "logprobs" value for `all` (null stays an empty list).
  nlohmann::json Wrap(const nlohmann::json& all) const;

  // The token's string and bytes, as described above.
  std::string TokenString(int32_t id) const;
  std::string TokenBytes(int32_t id) const;

 private:
  nlohmann::json Bytes(int32_t id) const;

  const text::Tokenizer* tokenizer_;
  bool chat_;
  int64_t offset_ = 0;  // code points of the choice's text so far (completions)
};

}  // namespace agentkv::api
