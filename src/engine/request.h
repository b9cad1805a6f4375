// What callers hand the engine and what comes back: a request carries prompt
// tokens, sampling parameters, a priority and an optional agent key whose
// resident KV it extends; its output comes back as RequestOutput events on a
// TokenStream.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/finish_reason.h"
#include "engine/sampling_params.h"
#include "util/status.h"

namespace agentkv::engine {

using RequestId = int64_t;

// Lower is more urgent. Waiting requests age towards HIGH (SchedulerOptions).
enum class Priority : int { kHigh = 0, kNormal = 1, kLow = 2 };

// "high", "normal", "low" (any case); InvalidArgument otherwise.
Result<Priority> ParsePriority(std::string_view text);
std::string_view PriorityName(Priority p);

// Where a request's cached prompt tokens came from (the deepest tier used).
enum class CacheSource : int { kNone = 0, kResident = 1, kHost = 2, kDisk = 3 };
std::string_view CacheSourceName(CacheSource s);  // "none", "resident", "host", "disk"

struct EngineRequest {
  std::vector<int32_t> prompt;  // at least one token
  SamplingParams params;        // Validate()d by Engine::Submit
  Priority priority = Priority::kNormal;
  // Agent whose resident blocks this request extends, and who keeps this
  // request's KV resident after it ends. Empty: none.
  std::string agent_key;
  // Salts the KV block hash chain (cache/block_hash.h ChainRoot): the
  // request shares cached KV, in the pool and in every tier, only with
  // requests of the same salt. The server sets the tenant here; empty:
  // unsalted (no tenants), the chain as it always was.
  std::string cache_salt;
};

// One output token's logprobs (SamplingParams::logprobs): its own and the
// most likely tokens', most likely first.
struct OutputLogprobs {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct RequestOutput {
  enum class Kind { kDelta, kFinished, kError };
  Kind kind = Kind::kDelta;
  std::vector<int32_t> tokens;  // new output tokens (kDelta)
  // kDelta of a request with params.logprobs: one entry per entry of
  // `tokens`, in order. Empty otherwise.
  std::vector<OutputLogprobs> logprobs;
  std::string text;  // new text, stop strings held back and cut (kDelta, kFinished)
  // kFinished:
  FinishReason finish = FinishReason::kNone;
  bool cancelled = false;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;    // prompt tokens not prefilled (resident or restored)
  int64_t restored_tokens = 0;  // of those, restored from a tier (host memory or disk)
  CacheSource cache_source = CacheSource::kNone;
  int64_t completion_tokens = 0;
  double ttft_s = 0;  // submit to first token
  // kError:
  Status error;
};

}  // namespace agentkv::engine
