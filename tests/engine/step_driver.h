// Drives a backend through the same greedy run step by step (ForwardSampled)
// or pipelined (LaunchStep / CollectStep, each decode step launched before
// the previous one is collected and naming its picks by prev_row), for tests
// that the two agree.
#pragma once

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "gtest/gtest.h"

namespace agentkv::testing {

// A sequence as the tests drive it: its tokens, block tables per group and
// how many tokens are in the cache.
struct TestSeq {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> tables;  // per group
  int computed = 0;
};

// The step that runs tokens [computed, computed + n) of `s`.
inline backend::SeqStep StepOf(const TestSeq& s, int n, bool want) {
  backend::SeqStep st;
  st.tokens = std::span<const int32_t>(s.tokens).subspan(s.computed, n);
  st.start_pos = s.computed;
  st.want_logits = want;
  for (size_t g = 0; g < s.tables.size(); ++g) st.block_tables[g] = s.tables[g];
  return st;
}

// Three sequences (prompts of 45, 20 and 3 random tokens) prefilled in
// chunks of up to 16 tokens, step by step, then `decode` steps of one token
// each. Returns every greedy pick in order. Sequence s uses blocks
// s * 64 + i, so contexts must stay under 64 blocks. Pipelined with
// sample_every > 0: decode steps k with k % sample_every == 1 sample row 1
// (its logits come back; the host takes their argmax, the same token) and
// are collected at once, the step after them taking every token from the
// host. With draw_row1, row 1 of every decode step is drawn by the backend
// (PickMode::kDevice: temperature 1, top_k 40, top_p 0.9, u from a fixed
// sequence) instead of picked greedily, in both modes. With `logprobs`,
// the decode steps' backend-picked rows ask for logprobs too (rows 0, 1, 2:
// 5, 3 and 20 top entries), and each decode step's collected_logprobs() (3
// entries, in step order) are appended to it.
inline std::vector<int32_t> GreedyPicks(backend::Backend& b, int decode, bool pipelined,
                                        uint32_t seed, int sample_every = 0, bool draw_row1 = false,
                                        std::vector<backend::RowLogprobs>* logprobs = nullptr) {
  using Seq = TestSeq;
  const cache::ModelCacheSpec& spec = b.cache_spec();
  const int bs = b.kv_layout().block_size;
  const int V = b.config().vocab_size;
  std::mt19937 rng(seed);
  std::vector<Seq> seqs(3);
  const int lens[] = {45, 20, 3};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < lens[i]; ++j) seqs[i].tokens.push_back(static_cast<int32_t>(rng() % V));
  auto step_of = [&](int i, int n, bool want) {
    Seq& s = seqs[i];
    s.tables.resize(spec.groups.size());
    for (size_t g = 0; g < spec.groups.size(); ++g) {
      const int need = spec.BlocksFor(static_cast<int>(g), s.computed + n, bs);
      while (static_cast<int>(s.tables[g].size()) < need)
        s.tables[g].push_back(i * 64 + static_cast<int32_t>(s.tables[g].size()));
    }
    return StepOf(s, n, want);
  };
  std::vector<int32_t> out;
  std::vector<float> logits(3 * static_cast<size_t>(V));
  std::vector<int32_t> picks(3);
  const std::vector<uint8_t> greedy(3, 1);
  // Prefill, step by step, until every sequence has its first pick.
  std::vector<bool> started(3, false);
  while (std::count(started.begin(), started.end(), true) < 3) {
    std::vector<backend::SeqStep> steps;
    std::vector<int> which;
    for (int i = 0; i < 3; ++i) {
      if (started[i]) continue;
      const int left = static_cast<int>(seqs[i].tokens.size()) - seqs[i].computed;
      const int n = std::min(left, 16);
      steps.push_back(step_of(i, n, n == left));
      which.push_back(i);
    }
    EXPECT_TRUE(b.ForwardSampled(steps, greedy, picks, logits).ok());
    int r = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
      Seq& s = seqs[which[k]];
      s.computed += static_cast<int>(steps[k].tokens.size());
      if (!steps[k].want_logits) continue;
      started[which[k]] = true;
      s.tokens.push_back(picks[r]);
      out.push_back(picks[r++]);
    }
  }
  // Pipelined: each step's picks land in placeholders at pend_at, read by
  // the next step through prev_row, and are collected after it launched.
  std::vector<size_t> pend_at(3);
  bool pending = false;  // a step launched and not collected
  auto collect = [&](bool sampled) {
    EXPECT_TRUE(b.CollectStep(picks).ok());
    if (logprobs != nullptr) {
      const std::span<const backend::RowLogprobs> lp = b.collected_logprobs();
      EXPECT_EQ(lp.size(), 3u);
      logprobs->insert(logprobs->end(), lp.begin(), lp.end());
    }
    for (int i = 0; i < 3; ++i) {
      int32_t p = picks[i];
      if (sampled && i == 1) {  // the host picks it from the logits
        const float* row = logits.data() + static_cast<size_t>(i) * V;
        p = static_cast<int32_t>(std::max_element(row, row + V) - row);
      }
      seqs[i].tokens[pend_at[i]] = p;
      out.push_back(p);
    }
  };
  for (int k = 0; k < decode; ++k) {
    std::vector<backend::RowPick> plan(3);
    for (backend::RowPick& p : plan) p.mode = backend::PickMode::kGreedy;
    if (draw_row1) {
      plan[1].mode = backend::PickMode::kDevice;
      plan[1].sample.top_k = 40;
      plan[1].sample.top_p = 0.9f;
      plan[1].sample.u = (k * 0.6180339887 + 0.1) - static_cast<int>(k * 0.6180339887 + 0.1);
    }
    if (logprobs != nullptr) {
      plan[0].logprobs = 5;
      plan[1].logprobs = 3;
      plan[2].logprobs = 20;
    }
    std::vector<backend::SeqStep> steps;
    for (int i = 0; i < 3; ++i) {
      steps.push_back(step_of(i, 1, true));
      if (pending) steps.back().prev_row = i;
    }
    if (!pipelined) {
      EXPECT_TRUE(b.ForwardSampled(steps, plan, picks, logits).ok());
      if (logprobs != nullptr) {
        const std::span<const backend::RowLogprobs> lp = b.collected_logprobs();
        EXPECT_EQ(lp.size(), 3u);
        logprobs->insert(logprobs->end(), lp.begin(), lp.end());
      }
      for (int i = 0; i < 3; ++i) {
        seqs[i].computed += 1;
        seqs[i].tokens.push_back(picks[i]);
        out.push_back(picks[i]);
      }
      continue;
    }
    const bool sampled = sample_every > 0 && k % sample_every == 1;
    if (sampled) plan[1].mode = backend::PickMode::kHost;
    const Status st = b.LaunchStep(steps, plan, logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    for (Seq& s : seqs) s.computed += 1;
    if (pending) {
      EXPECT_EQ(b.steps_in_flight(), 2);
      collect(false);
    }
    for (int i = 0; i < 3; ++i) {
      pend_at[i] = seqs[i].tokens.size();
      seqs[i].tokens.push_back(-7);  // never read: prev_row stands for it
    }
    pending = true;
    if (sampled) {  // the next step needs row 1's token from the host
      collect(true);
      pending = false;
    }
  }
  if (pending) collect(false);
  EXPECT_EQ(b.steps_in_flight(), 0);
  return out;
}

// Two runs' logprobs (GreedyPicks) agree: the same counts and ids in the
// same order, values within `tol` (0: equal).
inline void ExpectSameLogprobs(const std::vector<backend::RowLogprobs>& want,
                               const std::vector<backend::RowLogprobs>& got, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].count, want[r].count) << "row " << r;
    for (int k = 0; k < want[r].count; ++k) {
      EXPECT_EQ(got[r].ids[k], want[r].ids[k]) << "row " << r << " entry " << k;
      EXPECT_NEAR(got[r].logprobs[k], want[r].logprobs[k], tol) << "row " << r << " entry " << k;
    }
    EXPECT_NEAR(got[r].chosen, want[r].chosen, tol) << "row " << r;
  }
}

}  // namespace agentkv::testing
