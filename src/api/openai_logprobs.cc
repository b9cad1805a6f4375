#include "api/openai_logprobs.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "api/served_model.h"
#include "engine/sampling_params.h"

namespace agentkv::api {
namespace {

using nlohmann::json;

int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// JSON has no -inf: a token with no probability (a NaN or masked logit)
// gets -9999.0, the value OpenAI reports for it, not a null that SDKs
// typed as a number reject.
double JsonLogprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

}  // namespace

Result<int> ParseChoiceCount(const json& body) {
  std::optional<int64_t> n;
  RETURN_IF_ERROR(GetOptionalInt(body, "n", &n));
  if (!n) return 1;
  if (*n < 1 || *n > kMaxChoices) {
    return InvalidArgument("'n' must be in [1, " + std::to_string(kMaxChoices) + "], got " +
                           std::to_string(*n));
  }
  return static_cast<int>(*n);
}

Result<std::optional<int32_t>> ParseLogprobs(const json& body, bool chat) {
  const int max = engine::SamplingParams::kMaxLogprobs;
  const std::string range = "[0, " + std::to_string(max) + "]";
  const bool has_lp = body.contains("logprobs") && !body["logprobs"].is_null();
  if (!chat) {
    if (has_lp && body["logprobs"].is_boolean()) {
      return InvalidArgument("'logprobs' must be an integer in " + range + " for completions");
    }
    std::optional<int64_t> n;
    RETURN_IF_ERROR(GetOptionalInt(body, "logprobs", &n));
    if (!n) return std::optional<int32_t>();
    if (*n > max) return InvalidArgument("'logprobs' must be in " + range);
    return std::optional<int32_t>(static_cast<int32_t>(*n));
  }
  bool on = false;
  if (has_lp) {
    if (!body["logprobs"].is_boolean()) return InvalidArgument("'logprobs' must be a boolean");
    on = body["logprobs"].get<bool>();
  }
  std::optional<int64_t> top;
  RETURN_IF_ERROR(GetOptionalInt(body, "top_logprobs", &top));
  if (top && *top > max) return InvalidArgument("'top_logprobs' must be in " + range);
  if (top && !on) return InvalidArgument("'top_logprobs' requires 'logprobs' to be true");
  if (!on) return std::optional<int32_t>();
  return std::optional<int32_t>(static_cast<int32_t>(top.value_or(0)));
}

std::string OpenAiLogprobs::TokenString(int32_t id) const {
  const int32_t one[1] = {id};
  return tokenizer_->DecodeFragment(one, false, false);
}

std::string OpenAiLogprobs::TokenBytes(int32_t id) const {
  std::optional<std::string> b = tokenizer_->TokenBytes(id);
  return b ? *b : TokenString(id);
}

json OpenAiLogprobs::Bytes(int32_t id) const {
  json a = json::array();
  for (unsigned char c : TokenBytes(id)) a.push_back(static_cast<int>(c));
  return a;
}

json OpenAiLogprobs::Entries(std::span<const int32_t> tokens,
                             std::span<const engine::OutputLogprobs> lps) {
  const size_t n = std::min(tokens.size(), lps.size());
  if (chat_) {
    json content = json::array();
    for (size_t i = 0; i < n; ++i) {
      json top = json::array();
      for (const engine::TokenLogprob& t : lps[i].top) {
        top.push_back({{"token", TokenString(t.token)},
                       {"logprob", JsonLogprob(t.logprob)},
                       {"bytes", Bytes(t.token)}});
      }
      content.push_back({{"token", TokenString(tokens[i])},
                         {"logprob", JsonLogprob(lps[i].logprob)},
                         {"bytes", Bytes(tokens[i])},
                         {"top_logprobs", std::move(top)}});
    }
    return content;
  }
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (size_t i = 0; i < n; ++i) {
    const std::string s = TokenString(tokens[i]);
    json top = json::object();
    for (const engine::TokenLogprob& t : lps[i].top) {
      const std::string k = TokenString(t.token);
      if (!top.contains(k)) top[k] = JsonLogprob(t.logprob);
    }
    if (!top.contains(s)) top[s] = JsonLogprob(lps[i].logprob);  // the sampled token, always
    out["tokens"].push_back(s);
    out["token_logprobs"].push_back(JsonLogprob(lps[i].logprob));
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset_);
    offset_ += CodePoints(s);
  }
  return out;
}

void OpenAiLogprobs::Append(const json& entries, json* all) const {
  if (all->is_null()) {
    *all = entries;
    return;
  }
  if (chat_) {
    for (const json& e : entries) all->push_back(e);
    return;
  }
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const json& e : entries[k]) (*all)[k].push_back(e);
}

json OpenAiLogprobs::Wrap(const json& all) const {
  if (chat_) {
    return {{"content", all.is_null() ? json::array() : all}, {"refusal", nullptr}};
  }
  if (!all.is_null()) return all;
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

}  // namespace agentkv::api
