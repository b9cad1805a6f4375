// StopChecker: decides, token by token, when one sequence's generation ends
// and which of its text may be sent to the client now.
//
// Fed each new token id with its decoded text piece (complete UTF-8). Ends on
// an EOS id (unless ignore_eos), a stop token id, a stop string or
// max_tokens. Stop strings may span pieces; the text returned never contains
// a stop string or anything after it, and never contains bytes that might yet
// turn into one: such a tail is held back until the next piece decides it.
// When several stop strings match, the one that completes first in the text
// wins (then the one starting first), so the result does not depend on how
// the text was split into tokens.
//
// Thread-safety: none; one per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/finish_reason.h"
#include "engine/sampling_params.h"

namespace agentkv::engine {

struct StopUpdate {
  std::string text;  // safe to emit now; may be empty
  FinishReason finish = FinishReason::kNone;
  // When finish is kStop: the index into params.stop of the matched stop
  // string, or the token id (EOS or stop_token_ids) that stopped; else -1.
  int32_t stop_string_index = -1;
  int32_t stop_token_id = -1;
};

class StopChecker {
 public:
  // `eos_token_ids`: the model's end-of-sequence ids (generation_config.json
  // may list several). `params.stop` must not contain empty strings.
  StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids);

  // Accounts one generated token. The text of a stopping token id is never
  // emitted. After a finish, further calls return the same finish, no text.
  StopUpdate Append(int32_t token, std::string_view piece);

  // Generation ended for a reason outside this checker (context full,
  // cancelled): returns the held-back text, which can no longer become a
  // stop string.
  std::string Flush();

  bool finished() const { return last_.finish != FinishReason::kNone; }
  int32_t num_tokens() const { return num_tokens_; }

 private:
  bool IsStopToken(int32_t token) const;
  StopUpdate Finish(FinishReason reason, std::string text);

  std::vector<std::string> stops_;
  std::vector<int32_t> stop_ids_;  // EOS (unless ignore_eos) + stop_token_ids
  int32_t max_tokens_;             // 0 = unlimited
  int32_t num_tokens_ = 0;
  std::string held_;  // a tail that may be the start of a stop string
  StopUpdate last_;   // the finish, once there is one (text unused)
};

}  // namespace agentkv::engine
