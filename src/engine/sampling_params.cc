#include "engine/sampling_params.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace agentkv::engine {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// NaN fails every comparison, so ranges are written as "inside" tests.
bool InClosed(float v, float lo, float hi) { return v >= lo && v <= hi; }

}  // namespace

Status SamplingParams::Validate() const {
  if (!InClosed(temperature, 0.0f, 2.0f)) {
    return InvalidArgument("temperature must be in [0, 2], got " + Num(temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + Num(top_p));
  }
  if (top_k < -1) {
    return InvalidArgument("top_k must be -1 or 0 (off) or a positive count, got " +
                           std::to_string(top_k));
  }
  if (!InClosed(min_p, 0.0f, 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + Num(min_p));
  }
  if (!(repetition_penalty > 0.0f) || std::isinf(repetition_penalty)) {
    return InvalidArgument("repetition_penalty must be a finite number > 0, got " +
                           Num(repetition_penalty));
  }
  if (!InClosed(presence_penalty, -2.0f, 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got " + Num(presence_penalty));
  }
  if (!InClosed(frequency_penalty, -2.0f, 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " + Num(frequency_penalty));
  }
  if (max_tokens && *max_tokens < 1) {
    return InvalidArgument("max_tokens must be at least 1, got " + std::to_string(*max_tokens));
  }
  if (stop.size() > kMaxStopStrings) {
    return InvalidArgument("at most " + std::to_string(kMaxStopStrings) + " stop strings, got " +
                           std::to_string(stop.size()));
  }
  for (const std::string& s : stop) {
    if (s.empty()) return InvalidArgument("stop strings must not be empty");
    if (s.size() > kMaxStopStringBytes) {
      return InvalidArgument("stop strings must be at most " + std::to_string(kMaxStopStringBytes) +
                             " bytes, got one of " + std::to_string(s.size()));
    }
  }
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return InvalidArgument("at most " + std::to_string(kMaxStopTokenIds) + " stop_token_ids, got " +
                           std::to_string(stop_token_ids.size()));
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0) return InvalidArgument("stop_token_ids must be >= 0, got " + std::to_string(id));
  }
  if (logprobs && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    return InvalidArgument("logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                           std::to_string(*logprobs));
  }
  if (grammar && ignore_eos)
    return InvalidArgument("ignore_eos cannot be combined with a response format");
  return Status::Ok();
}

}  // namespace agentkv::engine
