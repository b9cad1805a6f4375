// QkvPost and the bf16 KV store (qkv_post.cu) against the CPU norm and
// rotary (engine/backend/cpu/cpu_kernels.h).
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "engine/backend/cpu/cpu_kernels.h"
#include "engine/backend/cuda/kernels/qkv_post.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

// From the fp32 projection and from a bf16 one (prefill steps), against the
// CPU norm and rotary of the same (bf16-rounded) values; with llama3
// frequencies, and with GPT-OSS's YaRN (its frequencies and the attention
// factor on cos and sin).
TEST(CudaKernels, QkvPostMatchesNormAndRope) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(3);
  // 600 tokens: one block per token, so each warp takes several heads
  // (loaded together in the specialised kernels).
  for (const bool yarn : {false, true})
    for (const bool bf16_in : {false, true})
      for (auto [D, T] : {std::pair{16, 6}, {64, 6}, {128, 6}, {256, 6}, {64, 600}, {128, 600}}) {
        const int nh = 8, nkv = 2, heads = nh + 2 * nkv;
        model::RopeSpec rope;
        rope.theta = 500000.f;
        rope.type = "llama3";
        rope.factor = 8.f;
        rope.original_max_position = 1024;
        if (yarn) {
          rope.theta = 150000.f;
          rope.type = "yarn";
          rope.factor = 32.f;
          rope.beta_fast = 32.f;
          rope.beta_slow = 1.f;
          rope.original_max_position = 4096;
          rope.truncate = false;
        }
        const auto inv = RopeInvFreq(rope, D);
        const float factor = RopeAttentionFactor(rope);
        if (yarn) {
          ASSERT_GT(factor, 1.1f);  // (so the test sees it)
        }
        std::vector<int32_t> pos = {0, 1, 17, 300, 4095, 70000};
        for (int t = 6; t < T; ++t) pos.push_back(t * 37);
        auto qkv = Random(T * heads * D, rng);
        if (bf16_in) qkv = Rounded(qkv);
        auto bias = Random(heads * D, rng, 0.1f);
        auto qn = Random(D, rng, 0.1f, 1.f), kn = Random(D, rng, 0.1f, 1.f);
        auto dqkv = bf16_in ? Upload(Bf16Of(qkv)) : Upload(qkv), db = Upload(bias),
             dqn = Upload(qn), dkn = Upload(kn), dinv = Upload(inv), dpos = Upload(pos);
        auto q = Poisoned<uint16_t>(T * nh * D), k = Poisoned<uint16_t>(T * nkv * D),
             v = Poisoned<uint16_t>(T * nkv * D);
        const cudaError_t e =
            bf16_in ? LaunchQkvPost(dqkv.get<bf16_t>(), db.get<float>(), dqn.get<float>(),
                                    dkn.get<float>(), dinv.get<float>(), factor,
                                    dpos.get<int32_t>(), T, nh, nkv, D, 1e-6f, false,
                                    q.get<bf16_t>(), k.get<bf16_t>(), v.get<bf16_t>(), nullptr)
                    : LaunchQkvPost(dqkv.get<float>(), db.get<float>(), dqn.get<float>(),
                                    dkn.get<float>(), dinv.get<float>(), factor,
                                    dpos.get<int32_t>(), T, nh, nkv, D, 1e-6f, false,
                                    q.get<bf16_t>(), k.get<bf16_t>(), v.get<bf16_t>(), nullptr);
        ASSERT_EQ(e, cudaSuccess);
        std::vector<float> rq, rk, rv;
        for (int t = 0; t < T; ++t) {
          std::vector<float> row(qkv.begin() + t * heads * D, qkv.begin() + (t + 1) * heads * D);
          for (int i = 0; i < heads * D; ++i) row[i] += bias[i];
          float* qp = row.data();
          float* kp = qp + nh * D;
          cpu::kernels::RmsNorm(qp, qn.data(), qp, nh, D, 1e-6f, false);
          cpu::kernels::RmsNorm(kp, kn.data(), kp, nkv, D, 1e-6f, false);
          cpu::kernels::ApplyRope(qp, nh, D, pos[t], inv.data(), factor);
          cpu::kernels::ApplyRope(kp, nkv, D, pos[t], inv.data(), factor);
          rq.insert(rq.end(), qp, qp + nh * D);
          rk.insert(rk.end(), kp, kp + nkv * D);
          rv.insert(rv.end(), kp + nkv * D, kp + 2 * nkv * D);
        }
        const std::string what = std::to_string(D) + " " + std::to_string(T) + " " +
                                 std::to_string(bf16_in) + " " + rope.type;
        EXPECT_LT(RelErr(DownloadBf16(q, rq.size()), rq), 1e-2) << what;
        EXPECT_LT(RelErr(DownloadBf16(k, rk.size()), rk), 1e-2) << what;
        EXPECT_LT(RelErr(DownloadBf16(v, rv.size()), rv), 1e-2) << what;
        if (!bf16_in || D != 64) continue;
        // Prompt steps whose attention reads the cache: K and V into the
        // paged cache only (k, v null), q as before. Token t is the only
        // token of sequence t, its row in block t.
        const int bs = 16, row = nkv * D;
        int width = 0;
        for (int p : pos) width = std::max(width, p / bs + 1);
        std::vector<int32_t> tables(static_cast<size_t>(T) * width, 0), tok_seq(T);
        for (int t = 0; t < T; ++t) {
          tables[static_cast<size_t>(t) * width + pos[t] / bs] = t;
          tok_seq[t] = t;
        }
        auto dtab = Upload(tables), dts = Upload(tok_seq), dw = Upload(std::vector<int32_t>{width});
        auto cache = Poisoned<uint16_t>(static_cast<size_t>(T) * 2 * bs * row);
        auto q2 = Poisoned<uint16_t>(T * nh * D);
        KvCacheView view;
        view.base = cache.get<bf16_t>();
        view.block_stride = 2 * bs * row;
        view.block_size = bs;
        view.tables = dtab.get<int32_t>();
        view.table_stride = dw.get<int32_t>();
        ASSERT_EQ(LaunchQkvPostStore(dqkv.get<bf16_t>(), db.get<float>(), dqn.get<float>(),
                                     dkn.get<float>(), dinv.get<float>(), factor,
                                     dpos.get<int32_t>(), dts.get<int32_t>(), T, nh, nkv, D, 1e-6f,
                                     false, q2.get<bf16_t>(), nullptr, nullptr, view, nullptr),
                  cudaSuccess);
        EXPECT_EQ(DownloadBf16(q2, rq.size()), DownloadBf16(q, rq.size())) << T;
        const std::vector<float> all = DownloadBf16(cache, static_cast<size_t>(T) * 2 * bs * row);
        std::vector<float> ck, cv;
        for (int t = 0; t < T; ++t) {
          const size_t at = static_cast<size_t>(t) * 2 * bs * row + (pos[t] % bs) * row;
          ck.insert(ck.end(), all.begin() + at, all.begin() + at + row);
          cv.insert(cv.end(), all.begin() + at + bs * row, all.begin() + at + bs * row + row);
        }
        EXPECT_EQ(ck, DownloadBf16(k, rk.size())) << T;
        EXPECT_EQ(cv, DownloadBf16(v, rv.size())) << T;
      }
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
