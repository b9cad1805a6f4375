#include "engine/backend/backend.h"

#include <algorithm>
#include <limits>
#include <string>

#include "engine/backend/sample_draw.h"

namespace agentkv::backend {

Status CheckSteps(std::span<const SeqStep> batch, const model::ModelConfig& config,
                  const cache::ModelCacheSpec& spec, const KvLayout& layout, bool allow_prev_row,
                  bool allow_multi_rows) {
  const int bs = layout.block_size;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SeqStep& st = batch[s];
    if (st.tokens.empty() || st.start_pos < 0)
      return InvalidArgument("Forward: sequence " + std::to_string(s) + " has no new tokens");
    if (st.prev_row >= 0 && !allow_prev_row)
      return InvalidArgument("Forward: prev_row is for LaunchStep only");
    if (st.logit_rows < 1 || static_cast<size_t>(st.logit_rows) > st.tokens.size())
      return InvalidArgument("Forward: sequence " + std::to_string(s) + " asks " +
                             std::to_string(st.logit_rows) + " logits rows of " +
                             std::to_string(st.tokens.size()) + " tokens");
    if (st.want_logits && st.logit_rows > 1 && !allow_multi_rows)
      return Unimplemented("Forward: this backend gives one logits row per sequence");
    if (st.want_logits && st.logit_rows > 1 && st.prev_row >= 0)
      return InvalidArgument("Forward: several logits rows with prev_row");
    const size_t checked = st.tokens.size() - (st.prev_row >= 0 ? 1 : 0);
    for (int32_t t : st.tokens.first(checked))
      if (t < 0 || t >= config.vocab_size)
        return InvalidArgument("Forward: token id " + std::to_string(t) + " out of range");
    const int64_t end = static_cast<int64_t>(st.start_pos) + st.tokens.size();
    for (size_t g = 0; g < spec.groups.size(); ++g) {
      const int ring = spec.RingBlocks(static_cast<int>(g), bs);
      const int64_t need =
          ring > 0 ? std::min<int64_t>(ring, (end + bs - 1) / bs) : (end + bs - 1) / bs;
      if (static_cast<int64_t>(st.block_tables[g].size()) < need)
        return InvalidArgument("Forward: sequence " + std::to_string(s) + " block table of group " +
                               std::to_string(g) + " holds " +
                               std::to_string(st.block_tables[g].size()) + " blocks, needs " +
                               std::to_string(need));
      for (int64_t i = 0; i < need; ++i) {
        const int32_t b = st.block_tables[g][i];
        if (b < 0 || b >= layout.blocks_per_group[g])
          return InvalidArgument("Forward: block id " + std::to_string(b) + " out of range");
      }
    }
  }
  return Status::Ok();
}

Status Backend::ForwardSampled(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                               std::span<int32_t> tokens, std::span<float> logits) {
  collected_rows_ = -1;  // its logits may go anywhere (LaunchStep restores it)
  RETURN_IF_ERROR(Forward(batch, logits));
  const int64_t vocab = config().vocab_size;
  sampled_logprobs_.assign(tokens.size(), RowLogprobs{});
  for (RowLogprobs& lp : sampled_logprobs_) lp.count = -1;
  std::vector<float> scratch;
  for (size_t r = 0; r < rows.size() && r < tokens.size(); ++r) {
    if (rows[r].mode == PickMode::kHost) continue;
    const std::span<float> row = logits.subspan(static_cast<size_t>(r * vocab), vocab);
    const bool lp = rows[r].logprobs >= 0;
    if (rows[r].mode == PickMode::kGreedy) {
      int32_t best = 0;
      float best_v = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < vocab; ++i) {
        if (row[i] > best_v) {  // strict: the lowest id wins ties; NaN never wins
          best_v = row[i];
          best = static_cast<int32_t>(i);
        }
      }
      tokens[r] = best;
    } else if (lp || rows[r].keep_logits) {
      // The draw clobbers its row: draw from a copy, keep the logits.
      scratch.assign(row.begin(), row.end());
      tokens[r] = PickDeviceRow(scratch, rows[r]);
    } else {
      tokens[r] = PickDeviceRow(row, rows[r]);
    }
    if (lp) {
      const double scale = rows[r].mode == PickMode::kDevice
                               ? 1.0 / static_cast<double>(rows[r].sample.temperature)
                               : 1.0;
      sampled_logprobs_[r] = ComputeRowLogprobs(row.data(), static_cast<int32_t>(vocab), scale,
                                                rows[r].logprobs, tokens[r]);
    }
  }
  collected_logprobs_ = sampled_logprobs_;
  return Status::Ok();
}

Status Backend::LaunchStep(std::span<const SeqStep> batch, std::span<const RowPick> rows,
                           std::span<float> logits) {
  if (static_cast<int>(launched_.size()) >= kMaxStepsInFlight)
    return Internal("LaunchStep: " + std::to_string(kMaxStepsInFlight) +
                    " steps already in flight");
  // Steps naming a pick get a copy of their tokens with it in place.
  std::vector<SeqStep> steps(batch.begin(), batch.end());
  std::vector<std::vector<int32_t>> owned;
  owned.reserve(steps.size());
  int num_rows = 0;
  for (SeqStep& st : steps) {
    num_rows += LogitRows(st);
    if (st.prev_row < 0) continue;
    if (st.tokens.empty() || st.prev_row >= static_cast<int32_t>(last_picks_.size()))
      return InvalidArgument("LaunchStep: prev_row " + std::to_string(st.prev_row) +
                             " names no row of the previous step");
    owned.emplace_back(st.tokens.begin(), st.tokens.end());
    owned.back().back() = last_picks_[st.prev_row];
    st.tokens = owned.back();
    st.prev_row = -1;
  }
  std::vector<int32_t> picks(num_rows, 0);
  // This step's logits go to `logits`: the kept rows of the step collected
  // last stay where they are unless the spans overlap (KeptLogitsInPlace).
  const int64_t collected_rows = collected_rows_;
  RETURN_IF_ERROR(ForwardSampled(steps, rows, picks, logits));
  collected_rows_ = collected_rows;
  last_picks_ = picks;
  launched_.push_back(std::move(picks));
  launched_logits_.push_back(logits);
  launched_logprobs_.push_back(std::move(sampled_logprobs_));
  sampled_logprobs_.clear();
  return Status::Ok();
}

Status Backend::ReadKeptLogits(std::span<const int32_t> /*rows*/, std::span<float> /*logits*/) {
  return Unimplemented("ReadKeptLogits: this backend does not keep logits rows");
}

Status Backend::KeptLogitsInPlace(std::span<const int32_t> rows, std::span<float> logits) const {
  if (collected_rows_ < 0 || launched_.size() > 1)
    return Internal(
        "ReadKeptLogits: the step collected last is not the last launched or the one before it");
  const int64_t vocab = config().vocab_size;
  if (launched_.size() == 1) {
    // One later step in flight: its logits must not have gone where the
    // collected step's are, and the caller reads them where they are.
    const std::span<float> later = launched_logits_.front();
    const float* a = collected_logits_.data();
    const float* a_end = a + collected_rows_ * vocab;
    const float* b = later.data();
    const float* b_end = b + later.size();
    if (a < b_end && b < a_end)
      return Internal("ReadKeptLogits: the step in flight reused the collected step's logits");
    if (logits.data() != collected_logits_.data())
      return InvalidArgument("ReadKeptLogits: not the collected step's logits span");
  }
  for (int32_t r : rows)
    if (r < 0 || r >= collected_rows_)
      return InvalidArgument("ReadKeptLogits: row " + std::to_string(r) + " out of range");
  if (static_cast<int64_t>(logits.size()) < collected_rows_ * vocab)
    return InvalidArgument("ReadKeptLogits: logits buffer too small");
  return Status::Ok();
}

Status Backend::CollectStep(std::span<int32_t> picks) {
  if (launched_.empty()) return Internal("CollectStep: no step in flight");
  if (picks.size() < launched_.front().size())
    return InvalidArgument("CollectStep: picks buffer too small");
  std::copy(launched_.front().begin(), launched_.front().end(), picks.begin());
  collected_rows_ = static_cast<int64_t>(launched_.front().size());
  collected_logits_ = launched_logits_.front();
  launched_.pop_front();
  launched_logits_.pop_front();
  collected_logprobs_ = std::move(launched_logprobs_.front());
  launched_logprobs_.pop_front();
  return Status::Ok();
}

}  // namespace agentkv::backend
