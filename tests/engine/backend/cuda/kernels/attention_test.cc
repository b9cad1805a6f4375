// Paged attention (attention.cu and the kernels it dispatches to) against
// the CPU reference, and the decode attention with the rotary fused in.
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
#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/qkv_post.h"
#include "engine/backend/rope.h"
#include "kernel_test_util.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::testing;

// Paged attention against AttendOne over the same bf16 values: sequences
// mixing a long prefill chunk, chunks continuing cached context and decode
// tokens; full attention and sliding rings; with and without key splits;
// narrow (decode) and wide (prefill) tiles; with attention sinks (random
// per-head logits of the scores' size, so that they move every output).
struct AttnCase {
  int head_dim, nh, nkv, window, splits;
  bool sinks = false;
  bool wide = false;
};

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpuReference) {
  AGENTKV_REQUIRE_GPU();
  const AttnCase pc = GetParam();
  const int D = pc.head_dim, nh = pc.nh, nkv = pc.nkv, G = nh / nkv, bs = 16;
  std::mt19937 rng(7 + D + pc.window + pc.splits + (pc.sinks ? 100 : 0));
  struct Seq {
    int start, n;
  };
  const std::vector<Seq> seqs = {{0, 37}, {100, 1}, {50, 9}, {530, 1}, {0, 1}, {200, 70}};
  const int ring = pc.window > 0 ? (pc.window + bs - 1) / bs + 1 : 0;
  // Block tables: distinct shuffled block ids per sequence.
  int width = 0;
  for (const Seq& s : seqs) width = std::max(width, (s.start + s.n + bs - 1) / bs);
  if (ring) width = std::min(width, ring);
  const int B = static_cast<int>(seqs.size());
  std::vector<int32_t> ids(B * width);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int num_blocks = B * width;
  const int64_t row = static_cast<int64_t>(nkv) * D;
  const int64_t block_stride = 2 * bs * row;  // one layer in the group
  std::vector<uint16_t> cache(num_blocks * block_stride, ToBf16(NAN));
  // Every position's K and V (cached ones and this step's), bf16-exact.
  std::vector<std::vector<float>> keys(B), vals(B);
  int T = 0;
  for (int s = 0; s < B; ++s) {
    const int end = seqs[s].start + seqs[s].n;
    keys[s] = Rounded(Random(static_cast<size_t>(end) * row, rng));
    vals[s] = Rounded(Random(static_cast<size_t>(end) * row, rng));
    for (int p = 0; p < seqs[s].start; ++p) {  // in order: rings keep the newest
      const int lb = p / bs;
      const int blk = ids[s * width + (ring ? lb % ring : lb)];
      for (int i = 0; i < row; ++i) {
        cache[blk * block_stride + (p % bs) * row + i] = ToBf16(keys[s][p * row + i]);
        cache[blk * block_stride + (bs + p % bs) * row + i] = ToBf16(vals[s][p * row + i]);
      }
    }
    T += seqs[s].n;
  }
  std::vector<float> q = Rounded(Random(static_cast<size_t>(T) * nh * D, rng));
  std::vector<uint16_t> knew(T * row), vnew(T * row);
  std::vector<int32_t> pos(T), seq_start(B), seq_first(B), tile_seq, tile_t0, tile_n;
  const int tpt = TokensPerTile(G, pc.wide);
  int t = 0;
  for (int s = 0; s < B; ++s) {
    seq_start[s] = seqs[s].start;
    seq_first[s] = t;
    for (int i = 0; i < seqs[s].n; i += tpt) {
      tile_seq.push_back(s);
      tile_t0.push_back(t + i);
      tile_n.push_back(std::min(tpt, seqs[s].n - i));
    }
    for (int i = 0; i < seqs[s].n; ++i, ++t) {
      pos[t] = seqs[s].start + i;
      for (int j = 0; j < row; ++j) {
        knew[t * row + j] = ToBf16(keys[s][pos[t] * row + j]);
        vnew[t * row + j] = ToBf16(vals[s][pos[t] * row + j]);
      }
    }
  }
  tile_seq.push_back(0);  // a padding tile
  tile_t0.push_back(0);
  tile_n.push_back(0);
  const std::vector<float> sinks = Random(nh, rng, 1.5f, 0.5f);
  auto dsinks = Upload(sinks);
  auto dq = Upload(Bf16Of(q)), dk = Upload(knew), dv = Upload(vnew), dc = Upload(cache),
       dtab = Upload(ids), dpos = Upload(pos), dss = Upload(seq_start), dsf = Upload(seq_first),
       dts = Upload(tile_seq), dt0 = Upload(tile_t0), dtn = Upload(tile_n),
       dwidth = Upload(std::vector<int32_t>{width});
  auto part_o = Poisoned<float>(static_cast<size_t>(T) * nh * pc.splits * D);
  auto part_ml = Poisoned<float>(static_cast<size_t>(T) * nh * pc.splits * 2);
  auto out = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
  AttentionParams p;
  p.q = dq.get<bf16_t>();
  p.k_new = dk.get<bf16_t>();
  p.v_new = dv.get<bf16_t>();
  p.cache.base = dc.get<bf16_t>();
  p.cache.block_stride = block_stride;
  p.cache.layer_offset = 0;
  p.cache.block_size = bs;
  p.cache.ring = ring;
  p.cache.tables = dtab.get<int32_t>();
  p.cache.table_stride = dwidth.get<int32_t>();
  SetStep(p, dpos, dss, dsf, {&dts, &dt0, &dtn}, static_cast<int>(tile_n.size()), T, nh, nkv, D);
  p.window = pc.window;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  p.softcap = pc.window == 7 ? 30.f : 0.f;
  p.splits = pc.splits;
  p.wide = pc.wide;
  p.sinks = pc.sinks ? dsinks.get<float>() : nullptr;
  p.part_o = part_o.get<float>();
  p.part_ml = part_ml.get<float>();
  p.out = out.get<bf16_t>();
  ASSERT_EQ(LaunchAttention(p, nullptr), cudaSuccess);
  std::vector<float> got = DownloadBf16(out, static_cast<size_t>(T) * nh * D);

  std::vector<float> ref(static_cast<size_t>(T) * nh * D), scores(4096);
  t = 0;
  for (int s = 0; s < B; ++s) {
    for (int i = 0; i < seqs[s].n; ++i, ++t) {
      const int ps = pos[t];
      const int lo = pc.window > 0 ? std::max(0, ps - pc.window + 1) : 0;
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / G;
        cpu::kernels::AttendOne(
            q.data() + (static_cast<int64_t>(t) * nh + h) * D, ps - lo + 1, D, p.scale, p.softcap,
            [&](int j) { return keys[s].data() + (lo + j) * row + kvh * D; },
            [&](int j) { return vals[s].data() + (lo + j) * row + kvh * D; }, scores.data(),
            ref.data() + (static_cast<int64_t>(t) * nh + h) * D, pc.sinks ? sinks[h] : -INFINITY);
      }
    }
  }
  EXPECT_LT(RelErr(got, ref), 2e-2);
  // The kernels CudaTuning's switches fall back on (AttentionParams::mma and
  // wgmma off): narrow tiles on the portable kernel, wide ones on the
  // mma.sync kernel.
  {
    AttentionParams plain = p;
    plain.mma = plain.wgmma = false;
    auto out_plain = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
    plain.out = out_plain.get<bf16_t>();
    ASSERT_EQ(LaunchAttention(plain, nullptr), cudaSuccess);
    EXPECT_LT(RelErr(DownloadBf16(out_plain, static_cast<size_t>(T) * nh * D), ref), 2e-2)
        << "mma and wgmma off";
  }
  // The warpgroup kernel's page copies (AttentionParams::kv_map): the same
  // step with its own keys in the cache as well, as LaunchQkvPostStore
  // leaves a prompt step's. The rows past each sequence stay NaN: the
  // kernel must not let them into the output.
  alignas(64) unsigned char map[kKvTensorMapBytes];
  if (pc.wide && pc.window == 0 && WgmmaAttentionSupported(D)) {
    ASSERT_TRUE(EncodeKvTensorMap(dc.get<bf16_t>(), num_blocks, block_stride, 1, bs, nkv, D, map));
    for (int s = 0; s < B; ++s)
      for (int ps = seqs[s].start; ps < seqs[s].start + seqs[s].n; ++ps) {
        const int blk = ids[s * width + ps / bs];
        for (int i = 0; i < row; ++i) {
          cache[blk * block_stride + (ps % bs) * row + i] = ToBf16(keys[s][ps * row + i]);
          cache[blk * block_stride + (bs + ps % bs) * row + i] = ToBf16(vals[s][ps * row + i]);
        }
      }
    auto dc2 = Upload(cache);
    auto dmap = Upload(std::vector<unsigned char>(map, map + sizeof(map)));
    auto out2 = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
    // The map names the first upload's blocks: copy the new contents there.
    ASSERT_EQ(cudaMemcpy(dc.get(), dc2.get(), cache.size() * 2, cudaMemcpyDeviceToDevice),
              cudaSuccess);
    p.kv_map = dmap.get();
    p.out = out2.get<bf16_t>();
    ASSERT_EQ(LaunchAttention(p, nullptr), cudaSuccess);
    EXPECT_LT(RelErr(DownloadBf16(out2, static_cast<size_t>(T) * nh * D), ref), 2e-2)
        << "with kv_map";
  }
  // On failure, which sequences (and so which key spans) are off.
  if (RelErr(got, ref) >= 2e-2) {
    t = 0;
    for (int s = 0; s < B; ++s) {
      const size_t at = static_cast<size_t>(t) * nh * D,
                   len = static_cast<size_t>(seqs[s].n) * nh * D;
      std::vector<float> g(got.begin() + at, got.begin() + at + len),
          r(ref.begin() + at, ref.begin() + at + len);
      ADD_FAILURE() << "sequence " << s << " (start " << seqs[s].start << ", " << seqs[s].n
                    << " tokens): rel err " << RelErr(g, r);
      t += seqs[s].n;
    }
  }
}

std::vector<AttnCase> AttnCases() {
  const std::vector<AttnCase> shapes = {{64, 32, 8, 0, 1},
                                        {64, 32, 8, 0, 7},
                                        {128, 32, 8, 0, 1},
                                        {128, 32, 8, 0, 4},
                                        {16, 4, 2, 7, 1},
                                        {16, 4, 2, 7, 3},
                                        {256, 8, 2, 40, 1},
                                        {256, 8, 2, 40, 5},
                                        {32, 4, 1, 0, 2},
                                        {128, 7, 1, 0, 1},
                                        {64, 16, 1, 0, 3},
                                        // The tensor-core kernels' masked stages
                                        // with a window, and with a softcap.
                                        {64, 32, 8, 40, 2},
                                        {64, 8, 2, 7, 1},
                                        // Attention sinks: GPT-OSS's shape (head_dim
                                        // 64, 8 heads a KV head, 128-token window or
                                        // none), split or not, and the other kernels.
                                        {64, 16, 2, 128, 1, true},
                                        {64, 16, 2, 128, 3, true},
                                        {64, 32, 4, 0, 1, true},
                                        {64, 32, 4, 0, 5, true},
                                        {128, 16, 8, 0, 2, true},
                                        {16, 4, 2, 7, 1, true},
                                        {32, 4, 1, 0, 2, true},
                                        // The splits bf16 decode plans for one
                                        // sequence (one wave: 64 at four blocks an
                                        // SM, 49 at three; most of them empty at
                                        // these lengths) and the merge's 64-split
                                        // form, with sinks and a window too.
                                        {64, 32, 8, 0, 64},
                                        {128, 32, 8, 0, 49},
                                        {64, 16, 2, 128, 64, true}};
  std::vector<AttnCase> all;
  for (bool wide : {false, true})
    for (AttnCase c : shapes) {
      if (wide && !WideAttentionSupported(c.head_dim)) continue;
      c.wide = wide;
      all.push_back(c);
    }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(AttnCases()),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return "D" + std::to_string(c.head_dim) + "_h" + std::to_string(c.nh) +
                                  "_kv" + std::to_string(c.nkv) + "_w" + std::to_string(c.window) +
                                  "_s" + std::to_string(c.splits) + (c.sinks ? "_sinks" : "") +
                                  (c.wide ? "_wide" : "");
                         });

// Decode attention given the projection (AttentionParams::qkv) against the
// two-kernel path it replaces (LaunchQkvPostStore, then attention on q, k,
// v): the same outputs and the same K/V rows left in the cache. Both paths
// are checked against the CPU references above. The projection given as
// planes to add gives the same bits.
TEST(CudaKernels, FusedRotaryAttentionMatchesQkvPostThenAttention) {
  AGENTKV_REQUIRE_GPU();
  std::mt19937 rng(21);
  struct Case {
    int D, nh, nkv, splits;
    bool bias, norm;
    bool yarn = false, sinks = false;  // GPT-OSS's rope and attention sinks
  };
  for (Case cs :
       {Case{64, 32, 8, 1, false, false}, Case{64, 32, 8, 4, true, false},
        Case{128, 16, 8, 3, false, true}, Case{128, 8, 4, 1, true, true},
        Case{64, 64, 8, 1, true, false, true, true}, Case{64, 64, 8, 4, true, false, true, true},
        // bf16 decode's wider splits (one wave of the form's blocks): the
        // block whose keys hold the step's token still stores it.
        Case{64, 32, 8, 64, false, false}, Case{128, 16, 8, 49, false, true}}) {
    if (!FusedRotarySupported(cs.D)) continue;
    const int D = cs.D, nh = cs.nh, nkv = cs.nkv, heads = nh + 2 * nkv, G = nh / nkv;
    const int bs = 16, width = 8, nblocks = 40, row = nkv * D;
    const std::vector<int> starts = {5, 40, 100, 0};  // one decode token each
    const int B = static_cast<int>(starts.size()), T = B;
    model::RopeSpec rope;
    rope.theta = 10000.f;
    if (cs.yarn) {
      rope.theta = 150000.f;
      rope.type = "yarn";
      rope.factor = 32.f;
      rope.original_max_position = 4096;
      rope.truncate = false;
    }
    const auto inv = RopeInvFreq(rope, D);
    const float factor = RopeAttentionFactor(rope);
    const auto sinks = Random(nh, rng, 1.f, 1.f);
    const auto qkv = Random(static_cast<size_t>(T) * heads * D, rng);
    const auto bias = Random(static_cast<size_t>(heads) * D, rng, 0.5f);
    const auto qn = Random(D, rng, 0.2f, 1.f), kn = Random(D, rng, 0.2f, 1.f);
    const int64_t block_stride = 2LL * bs * row;
    std::vector<uint16_t> cache0 = Bf16Of(Random(static_cast<size_t>(nblocks) * block_stride, rng));
    std::vector<int32_t> ids(B * width), pos(T), seq_start(B), seq_first(B + 1), tile_seq(T),
        tile_t0(T), tile_n(T, 1), tok_seq(T);
    std::vector<int> perm(nblocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < B * width; ++i) ids[i] = perm[i];
    for (int t = 0; t < T; ++t) {
      pos[t] = seq_start[t] = starts[t];
      seq_first[t] = tile_t0[t] = t;
      tile_seq[t] = tok_seq[t] = t;
    }
    seq_first[B] = T;
    auto dqkv = Upload(qkv), dbias = Upload(bias), dqn = Upload(qn), dkn = Upload(kn),
         dinv = Upload(inv), dtab = Upload(ids), dpos = Upload(pos), dss = Upload(seq_start),
         dsf = Upload(seq_first), dts = Upload(tile_seq), dt0 = Upload(tile_t0),
         dtn = Upload(tile_n), dtok = Upload(tok_seq), dwidth = Upload(std::vector<int32_t>{width}),
         dsinks = Upload(sinks);
    auto q = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
    auto k = Poisoned<uint16_t>(static_cast<size_t>(T) * row);
    auto v = Poisoned<uint16_t>(static_cast<size_t>(T) * row);
    auto part_o = Poisoned<float>(static_cast<size_t>(T) * nh * cs.splits * D);
    auto part_ml = Poisoned<float>(static_cast<size_t>(T) * nh * cs.splits * 2);
    // The projection also as three planes (half, half, zero: their sum is
    // exact), as a split-K GEMM leaves it.
    std::vector<float> planes(3 * qkv.size(), 0.f);
    for (size_t i = 0; i < qkv.size(); ++i) planes[i] = planes[qkv.size() + i] = qkv[i] / 2;
    auto dplanes = Upload(planes);
    std::vector<std::vector<float>> outs, caches;
    for (int mode = 0; mode < 3; ++mode) {
      const bool fused = mode > 0;
      auto dc = Upload(cache0);
      KvCacheView view;
      view.base = dc.get<bf16_t>();
      view.block_stride = block_stride;
      view.block_size = bs;
      view.tables = dtab.get<int32_t>();
      view.table_stride = dwidth.get<int32_t>();
      const float* b = cs.bias ? dbias.get<float>() : nullptr;
      const float* qnp = cs.norm ? dqn.get<float>() : nullptr;
      const float* knp = cs.norm ? dkn.get<float>() : nullptr;
      AttentionParams p;
      if (!fused) {
        ASSERT_EQ(LaunchQkvPostStore(dqkv.get<float>(), b, qnp, knp, dinv.get<float>(), factor,
                                     dpos.get<int32_t>(), dtok.get<int32_t>(), T, nh, nkv, D, 1e-6f,
                                     false, q.get<bf16_t>(), k.get<bf16_t>(), v.get<bf16_t>(), view,
                                     nullptr),
                  cudaSuccess);
        p.q = q.get<bf16_t>();
        p.k_new = k.get<bf16_t>();
        p.v_new = v.get<bf16_t>();
      } else {
        p.qkv = mode == 1 ? dqkv.get<float>() : dplanes.get<float>();
        p.qkv_planes = mode == 1 ? 1 : 3;
        p.qkv_plane = static_cast<int64_t>(qkv.size());
        p.bias = b;
        p.q_norm = qnp;
        p.k_norm = knp;
        p.inv_freq = dinv.get<float>();
        p.rope_factor = factor;
        p.eps = 1e-6f;
      }
      p.cache = view;
      SetStep(p, dpos, dss, dsf, {&dts, &dt0, &dtn}, T, T, nh, nkv, D);
      p.scale = 1.f / std::sqrt(static_cast<float>(D));
      p.splits = cs.splits;
      p.sinks = cs.sinks ? dsinks.get<float>() : nullptr;
      p.part_o = part_o.get<float>();
      p.part_ml = part_ml.get<float>();
      auto out = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
      p.out = out.get<bf16_t>();
      ASSERT_EQ(LaunchAttention(p, nullptr), cudaSuccess);
      outs.push_back(DownloadBf16(out, static_cast<size_t>(T) * nh * D));
      caches.push_back(DownloadBf16(dc, cache0.size()));
    }
    const std::string what = "D" + std::to_string(D) + " G" + std::to_string(G) + " splits " +
                             std::to_string(cs.splits) + (cs.yarn ? " yarn" : "") +
                             (cs.sinks ? " sinks" : "");
    EXPECT_LT(RelErr(outs[1], outs[0]), 1e-2) << what;
    EXPECT_LT(RelErr(caches[1], caches[0]), 1e-3) << what;  // one row per token and head
    EXPECT_EQ(outs[2], outs[1]) << what;
    EXPECT_EQ(caches[2], caches[1]) << what;
  }
  AttentionParams wide;  // the projection is for narrow (decode) tiles only
  wide.qkv = reinterpret_cast<const float*>(&wide);
  wide.num_tiles = 1;
  wide.nh = wide.nkv = 1;
  wide.head_dim = 64;
  wide.wide = true;
  EXPECT_EQ(LaunchAttention(wide, nullptr), cudaErrorInvalidValue);
  // Nor without the mma.sync kernel (the portable one has no such path).
  AttentionParams plain = wide;
  plain.wide = false;
  plain.mma = false;
  EXPECT_EQ(LaunchAttention(plain, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace agentkv::backend::cuda::kernels

#else

TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
