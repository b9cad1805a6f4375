// FinishReason: why a sequence's generation ended, as reported to callers in
// RequestOutput and decided by the StopChecker. Its own header so that the
// request types need not include the stop checker.
#pragma once

#include <string_view>

namespace agentkv::engine {

// kNone: not finished, or ended for a reason outside the stop rules
// (cancelled, error). kStop: an EOS or stop token id or a stop string.
// kLength: max_tokens reached or the context is full.
enum class FinishReason { kNone, kStop, kLength };

// "stop", "length", or "" for kNone (the OpenAI finish_reason strings).
std::string_view FinishReasonName(FinishReason reason);

}  // namespace agentkv::engine
