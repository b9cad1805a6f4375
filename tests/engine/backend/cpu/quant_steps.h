// Helpers shared by the quantized-checkpoint tests of the CPU backend
// (cpu_backend_quant_test.cc, cpu_moe_quant_test.cc): the same greedy steps
// on two backends, and their logits compared.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/backend.h"

namespace agentkv::testing {

// Logits of a 21-token prefill (the sgemm path of the quantized matmul),
// then `decode_steps` single-token steps (its streaming path), greedy, on
// freshly allocated KV (8 blocks of 16 per group).
inline std::vector<std::vector<float>> GreedySteps(backend::Backend& b, int decode_steps) {
  backend::KvLayout layout;
  layout.block_size = 16;
  for (int g = 0; g < backend::kMaxCacheGroups; ++g) layout.blocks_per_group[g] = 8;
  EXPECT_TRUE(b.AllocateKv(layout).ok());
  const std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int32_t> seq;
  for (int i = 0; i < 21; ++i) seq.push_back((i * 7919 + 13) % 5000);
  std::vector<float> logits(b.config().vocab_size);
  std::vector<std::vector<float>> out;
  int pos = 0;
  for (int step = 0; step <= decode_steps; ++step) {
    backend::SeqStep st;
    st.tokens = std::span(seq).subspan(pos);
    st.start_pos = pos;
    st.want_logits = true;
    for (size_t g = 0; g < b.cache_spec().groups.size(); ++g) st.block_tables[g] = table;
    Status s = b.Forward({&st, 1}, logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.push_back(logits);
    pos = static_cast<int>(seq.size());
    seq.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  return out;
}

// Every step's logits within 1e-5 of its largest |logit|: the same weight
// values in fp32 arithmetic, only the order of the sums differs (tiles).
inline void ExpectSameLogits(const std::vector<std::vector<float>>& got,
                             const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    float amax = 0, diff = 0;
    for (size_t i = 0; i < got[s].size(); ++i) {
      amax = std::max(amax, std::fabs(want[s][i]));
      diff = std::max(diff, std::fabs(got[s][i] - want[s][i]));
    }
    EXPECT_GT(amax, 0.f);
    EXPECT_LE(diff, 1e-5f * amax) << "step " << s << " amax " << amax;
    std::printf("step %zu: max |logit difference| %.3g of max |logit| %.3g\n", s, diff, amax);
  }
}

}  // namespace agentkv::testing
