#include "engine/stop_checker.h"

#include <algorithm>
#include <utility>

#include "engine/text/output/partial_match.h"

namespace agentkv::engine {

StopChecker::StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids)
    : stops_(params.stop), max_tokens_(params.max_tokens.value_or(0)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  if (!params.ignore_eos) stop_ids_.assign(eos_token_ids.begin(), eos_token_ids.end());
  stop_ids_.insert(stop_ids_.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
}

bool StopChecker::IsStopToken(int32_t token) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
}

StopUpdate StopChecker::Finish(FinishReason reason, std::string text) {
  last_.finish = reason;
  StopUpdate u = last_;
  u.text = std::move(text);
  return u;
}

StopUpdate StopChecker::Append(int32_t token, std::string_view piece) {
  if (finished()) return last_;
  ++num_tokens_;
  if (IsStopToken(token)) {
    last_.stop_token_id = token;
    return Finish(FinishReason::kStop, std::exchange(held_, {}));
  }
  std::string buf = std::exchange(held_, {});
  buf.append(piece);

  // The first stop string to complete; by the hold-back invariant every
  // match lies inside `buf`.
  size_t best_end = std::string::npos, best_pos = 0;
  int32_t best = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = buf.find(stops_[i]);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stops_[i].size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_end = end;
      best_pos = pos;
      best = static_cast<int32_t>(i);
    }
  }
  if (best >= 0) {
    last_.stop_string_index = best;
    buf.resize(best_pos);
    return Finish(FinishReason::kStop, std::move(buf));
  }
  if (max_tokens_ > 0 && num_tokens_ >= max_tokens_) {
    return Finish(FinishReason::kLength, std::move(buf));
  }
  size_t hold = 0;
  for (const std::string& s : stops_)
    hold = std::max(hold, text::output::PartialSuffixLength(buf, s));
  held_.assign(buf, buf.size() - hold, hold);
  buf.resize(buf.size() - hold);
  StopUpdate u;
  u.text = std::move(buf);
  return u;
}

std::string StopChecker::Flush() { return std::exchange(held_, {}); }

}  // namespace agentkv::engine
