// LaunchRowLogprobs against ComputeRowLogprobs, its CPU reference, on random
// logits (a 151,936 vocabulary and two small odd ones, split into slices
// differently; batches of 1 and 64;
// greedy and drawn rows with random temperatures and top counts 0..20;
// tied, NaN and -inf rows; rows the kernel must leave alone) with the
// output poisoned before the launch.
//
// Tolerance: the top entries must be the same ids in the same order and
// the same count; logprobs within 1e-4 absolute (the double sums run in
// another order, the outputs round to float; values reach ~-60 at
// temperature 0.2), lse within 1e-9 relative.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/cuda/kernels/logprob_kernel.h"
#include "engine/backend/row_logprobs.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

std::vector<float> RowLogits(int vocab, int kind, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = nd(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  switch (kind % 4) {
    case 0:  // peaked
      for (int i = 0; i < 8; ++i) l[static_cast<size_t>(id(rng))] += 10.f + i;
      break;
    case 1:  // coarse values: many exact ties in the top
      for (float& x : l) x = std::round(x);
      break;
    case 2:  // NaN and -inf tokens
      for (int i = 0; i < vocab / 10 + 1; ++i) {
        l[static_cast<size_t>(id(rng))] = std::numeric_limits<float>::quiet_NaN();
        l[static_cast<size_t>(id(rng))] = -std::numeric_limits<float>::infinity();
      }
      break;
    default:  // flat
      break;
  }
  return l;
}

TEST(LogprobKernel, MatchesTheCpuReference) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(41);
  std::uniform_real_distribution<double> un(0.0, 1.0);
  int checked = 0;
  // 151,936: 32 slices of 4,748; 9,001: 3 slices, the last shorter; 1,001:
  // one slice.
  for (int vocab : {151936, 9001, 1001}) {
    for (int batch : {1, 64}) {
      std::vector<float> logits;
      std::vector<std::vector<float>> rows;
      std::vector<RowPick> picks(static_cast<size_t>(batch));
      std::vector<int32_t> chosen(static_cast<size_t>(batch));
      for (int r = 0; r < batch; ++r) {
        rows.push_back(RowLogits(vocab, r, rng));
        RowPick& p = picks[static_cast<size_t>(r)];
        p.mode = r % 3 == 0 ? PickMode::kGreedy : PickMode::kDevice;
        p.sample.temperature = static_cast<float>(0.2 + 1.8 * un(rng));
        p.logprobs = static_cast<int8_t>(r == 0 ? 20 : r % 21);
        chosen[static_cast<size_t>(r)] = static_cast<int32_t>(un(rng) * vocab);
      }
      if (batch > 1) {
        picks[5].mode = PickMode::kHost;  // the host's row
        picks[6].logprobs = -1;           // no logprobs asked
        std::fill(rows[7].begin(), rows[7].end(), -std::numeric_limits<float>::infinity());
        std::fill(rows[8].begin(), rows[8].end(), std::numeric_limits<float>::quiet_NaN());
        rows[8][3] = 1.0f;  // one token that is not NaN: count 1
        picks[8].logprobs = 20;
        chosen[9] = -1;  // no chosen token: 0
      }
      for (const auto& row : rows) logits.insert(logits.end(), row.begin(), row.end());
      auto dl = Upload(logits);
      auto dp = Upload(picks);
      auto dc = Upload(chosen);
      auto out = Poisoned<RowLogprobs>(static_cast<size_t>(batch));
      // The slices' partials start poisoned too: the merge reads only what
      // the slice kernel wrote.
      auto scratch = Poisoned<std::byte>(RowLogprobsScratchBytes(batch, vocab));
      ASSERT_EQ(
          LaunchRowLogprobs(dl.get<float>(), batch, vocab, dp.get<RowPick>(), dc.get<int32_t>(),
                            out.get<RowLogprobs>(), scratch.get(), nullptr),
          cudaSuccess);
      const std::vector<RowLogprobs> got = Download<RowLogprobs>(out, static_cast<size_t>(batch));
      for (int r = 0; r < batch; ++r) {
        const RowPick& p = picks[static_cast<size_t>(r)];
        const RowLogprobs& g = got[static_cast<size_t>(r)];
        if (p.mode == PickMode::kHost || p.logprobs < 0) {
          EXPECT_EQ(g.count, -1) << "row " << r << " is not the kernel's";
          continue;
        }
        ++checked;
        const double scale = p.mode == PickMode::kDevice ? 1.0 / p.sample.temperature : 1.0;
        const RowLogprobs want = ComputeRowLogprobs(rows[static_cast<size_t>(r)].data(), vocab,
                                                    scale, p.logprobs, chosen[r]);
        ASSERT_EQ(g.count, want.count) << "vocab " << vocab << " row " << r;
        EXPECT_NEAR(g.lse, want.lse, 1e-9 * std::max(1.0, std::abs(want.lse))) << "row " << r;
        for (int k = 0; k < want.count; ++k) {
          EXPECT_EQ(g.ids[k], want.ids[k]) << "row " << r << " entry " << k;
          if (std::isinf(want.logprobs[k])) {
            EXPECT_EQ(g.logprobs[k], want.logprobs[k]);
          } else {
            EXPECT_NEAR(g.logprobs[k], want.logprobs[k], 1e-4) << "row " << r << " entry " << k;
          }
        }
        if (std::isinf(want.chosen)) {
          EXPECT_EQ(g.chosen, want.chosen) << "row " << r;
        } else {
          EXPECT_NEAR(g.chosen, want.chosen, 1e-4) << "row " << r;
        }
      }
      if (batch > 1) {
        EXPECT_EQ(got[8].count, 1);
        EXPECT_EQ(got[8].ids[0], 3);
        EXPECT_NEAR(got[8].logprobs[0], 0.0f, 1e-6);
        EXPECT_EQ(got[9].chosen, 0.0f);
        EXPECT_EQ(got[7].lse, 0.0);
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// A row is cut into slices of about 4,096 logits, 1 to 32 of them, and the
// scratch holds one partial per slice of every row; a launch without
// scratch is refused before anything runs.
TEST(LogprobKernel, SlicesAndScratch) {
  EXPECT_EQ(RowLogprobsSlices(1), 1);
  EXPECT_EQ(RowLogprobsSlices(4096), 1);
  EXPECT_EQ(RowLogprobsSlices(4097), 2);
  EXPECT_EQ(RowLogprobsSlices(128256), 32);
  EXPECT_EQ(RowLogprobsSlices(1 << 24), 32);
  EXPECT_EQ(RowLogprobsScratchBytes(0, 128256), 0u);
  EXPECT_EQ(RowLogprobsScratchBytes(64, 128256), 2 * RowLogprobsScratchBytes(32, 128256));
  EXPECT_EQ(RowLogprobsScratchBytes(1, 128256), 32 * RowLogprobsScratchBytes(1, 1000));
  EXPECT_EQ(LaunchRowLogprobs(nullptr, 1, 1000, nullptr, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(LogprobKernel, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
