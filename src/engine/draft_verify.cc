#include "engine/draft_verify.h"

#include "engine/backend/sample_draw.h"

namespace agentkv::engine {

DraftVerdict VerifyGreedyDraft(std::span<const int32_t> draft, std::span<const int32_t> picks) {
  DraftVerdict v;
  while (static_cast<size_t>(v.accepted) < draft.size() &&
         static_cast<size_t>(v.accepted) + 1 < picks.size() &&
         draft[static_cast<size_t>(v.accepted)] == picks[static_cast<size_t>(v.accepted)])
    ++v.accepted;
  v.next = picks[static_cast<size_t>(v.accepted)];
  return v;
}

void PlanSampledDraft(std::span<const int32_t> draft,
                      const std::function<backend::SampleSettings()>& next_draw,
                      std::vector<backend::RowPick>* out) {
  for (int32_t d : draft) {
    backend::RowPick pick;
    pick.mode = backend::PickMode::kDevice;
    pick.draft = d;
    pick.u_accept = next_draw().u;
    pick.sample = next_draw();
    out->push_back(pick);
  }
  backend::RowPick last;
  last.mode = backend::PickMode::kDevice;
  last.sample = next_draw();
  out->push_back(last);
}

DraftVerdict VerifySampledDraft(std::span<const int32_t> draft, std::span<float> logits,
                                int32_t vocab, const backend::SampleSettings& settings,
                                const std::function<double()>& uniform) {
  std::vector<backend::RowPick> plan;
  PlanSampledDraft(
      draft,
      [&] {
        backend::SampleSettings s = settings;
        s.u = uniform();
        return s;
      },
      &plan);
  const size_t n = static_cast<size_t>(vocab);
  std::vector<int32_t> picks(plan.size());
  for (size_t j = 0; j < plan.size(); ++j) {
    picks[j] = backend::PickDeviceRow(logits.subspan(j * n, n), plan[j]);
    if (j < draft.size() && picks[j] != draft[j]) break;  // later rows are not read
  }
  return VerifyGreedyDraft(draft, picks);
}

}  // namespace agentkv::engine
