// The mma.sync flash attention reading the fp8 KV cache through its fp8
// tile loader (fp8_kv_tile.cuh, flash_attention.cu), through
// LaunchAttention as the backend calls it: wide prompt tiles, narrow decode
// tiles with the keys split across blocks (up to 64, empty splits
// included), on the plain and the lean decode form, long contexts (4k-6k tokens),
// prompt chunks that start and end inside blocks, windows, block sizes that
// are not powers of two, several sequences in shuffled blocks of the second
// layer of a group. Against a double-precision reference on the dequantized
// cache (kvfp8::QuantizeRow / Decode, the CPU's format): every query row's
// keys from the cache before the step's start and from the step's quantized
// rows from it on.
//
// Tolerance: relative L2 error 1e-2 over all outputs (the kernel rounds q
// (exact here), each softmax weight times its value row's scale, and the
// output to bf16: measured errors of bf16 attention are ~3e-3; a wrong
// scale, row or block gives errors near 1). Outputs and partial results
// start poisoned (NaN), and so does every cache byte the kernel must not
// read (slots of the step's own positions, blocks outside the tables):
// reading one makes the error infinite. Skip without a GPU.
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/kernels/attention.h"
#include "engine/backend/cuda/kernels/fp8_kv.h"
#include "engine/backend/kv_fp8.h"

namespace agentkv::backend::cuda {
namespace {

using agentkv::testing::DownloadBf16;
using agentkv::testing::Poisoned;
using agentkv::testing::RelErr;
using agentkv::testing::RoundBf16;
using agentkv::testing::ToBf16;
using agentkv::testing::Upload;

// A sequence's part of the step: positions start .. start + n - 1 (keys
// before start are in the cache).
struct StepSeq {
  int start, n;
};

struct TileCase {
  std::string name;
  int head_dim;
  bool wide;  // prompt tiles of TokensPerTile(G, true) tokens
  int splits;
  int window;
  int block_size;
  std::vector<StepSeq> seqs;
  // AttentionParams::fp8_decode_lean (narrow tiles): the backend's default
  // form; false: the old one (CudaTuning::fp8_decode_lean off).
  bool lean = false;
};

void PrintTo(const TileCase& c, std::ostream* os) { *os << c.name; }

// Random values of magnitude ~2^e for a row-dependent e in [emin, emax].
std::vector<float> RandomRows(int64_t rows, int D, std::mt19937& rng, int emin, int emax,
                              bool bf16_exact) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(rows) * D);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = std::ldexp(1.f, static_cast<int>(rng() % (emax - emin + 1)) + emin);
    for (int d = 0; d < D; ++d) {
      const float x = mag * u(rng);
      v[static_cast<size_t>(r) * D + d] = bf16_exact ? RoundBf16(x) : x;
    }
  }
  return v;
}

class CudaFp8MmaAttention : public ::testing::TestWithParam<TileCase> {};

TEST_P(CudaFp8MmaAttention, MatchesTheDequantizedReference) {
  AGENTKV_REQUIRE_GPU();
  const TileCase& tc = GetParam();
  const int D = tc.head_dim, nh = 8, nkv = 2, G = nh / nkv, bs = tc.block_size, layers = 2;
  const int B = static_cast<int>(tc.seqs.size());
  const int64_t section = kvfp8::SectionBytes(bs, nkv, D);
  const int64_t block_bytes = layers * 2 * section;
  const int64_t layer_offset = 2 * section;  // the group's second layer
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(tc.name)));

  // Step layout and shuffled, distinct blocks.
  std::vector<int32_t> pos, tok_seq, seq_start(B), seq_first(B + 1);
  int width = 1, blocks = 1;  // block 0: never in a table
  for (int s = 0; s < B; ++s) {
    const StepSeq& q = tc.seqs[s];
    seq_start[s] = q.start;
    seq_first[s] = static_cast<int32_t>(pos.size());
    for (int i = 0; i < q.n; ++i) {
      pos.push_back(q.start + i);
      tok_seq.push_back(s);
    }
    const int nb = (q.start + q.n + bs - 1) / bs;
    width = std::max(width, nb);
    blocks += nb;
  }
  seq_first[B] = static_cast<int32_t>(pos.size());
  const int T = static_cast<int>(pos.size());
  std::vector<int32_t> ids(blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(B) * width, 0);
  for (int s = 0, next = 0; s < B; ++s)
    for (int b = 0; b < (tc.seqs[s].start + tc.seqs[s].n + bs - 1) / bs; ++b)
      tables[static_cast<size_t>(s) * width + b] = ids[next++];

  // Every position's K and V: older ones quantized into the cache, the
  // step's into the rows; the dequantized values for the reference.
  std::vector<uint8_t> cache_host(static_cast<size_t>(blocks) * block_bytes, 0xff);
  std::vector<uint8_t> rows_host(kernels::Fp8KvRowsBytes(T, nkv, D), 0xff);
  kernels::Fp8KvRows hr = kernels::Fp8KvRowsAt(rows_host.data(), T, nkv, D);
  std::vector<std::vector<double>> Kd(B), Vd(B);
  std::vector<uint8_t> bytes(D);
  for (int s = 0; s < B; ++s) {
    const int len = tc.seqs[s].start + tc.seqs[s].n;
    const std::vector<float> K = RandomRows(static_cast<int64_t>(len) * nkv, D, rng, -8, 8, false);
    const std::vector<float> V = RandomRows(static_cast<int64_t>(len) * nkv, D, rng, -8, 8, false);
    Kd[s].resize(K.size());
    Vd[s].resize(V.size());
    for (int p = 0; p < len; ++p) {
      for (int h = 0; h < nkv; ++h) {
        const size_t r = static_cast<size_t>(p) * nkv + h;
        for (int which = 0; which < 2; ++which) {
          const float scale = kvfp8::QuantizeRow((which ? V : K).data() + r * D, D, bytes.data());
          uint8_t* dst;
          float* sdst;
          if (p >= seq_start[s]) {
            const int64_t fr = static_cast<int64_t>(seq_first[s] + p - seq_start[s]) * nkv + h;
            dst = (which ? hr.v : hr.k) + fr * D;
            sdst = (which ? hr.v_scale : hr.k_scale) + fr;
          } else {
            const int blk = tables[static_cast<size_t>(s) * width + p / bs], in = p % bs;
            uint8_t* sec = cache_host.data() + blk * block_bytes + layer_offset + which * section;
            dst = sec + (static_cast<int64_t>(in) * nkv + h) * D;
            sdst = reinterpret_cast<float*>(sec + kvfp8::ScalesOffset(bs, nkv, D)) +
                   static_cast<int64_t>(in) * nkv + h;
          }
          std::copy(bytes.begin(), bytes.end(), dst);
          *sdst = scale;
          std::vector<double>& out = which ? Vd[s] : Kd[s];
          for (int d = 0; d < D; ++d)
            out[r * D + d] = static_cast<double>(kvfp8::Decode(bytes[d])) * scale;
        }
      }
    }
  }
  // Queries of modest size (scores of 1e5 would let the fp32 rounding of
  // near-tied scores, not the fp8 path, decide the comparison).
  const std::vector<float> q = RandomRows(static_cast<int64_t>(T) * nh, D, rng, -4, -1, true);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));

  std::vector<float> want(static_cast<size_t>(T) * nh * D);
  std::vector<double> sc;
  for (int t = 0; t < T; ++t) {
    const int s = tok_seq[t], p = pos[t];
    const int lo = tc.window > 0 ? std::max(0, p - tc.window + 1) : 0;
    sc.assign(p + 1, 0.0);
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / G;
      const float* qr = q.data() + (static_cast<size_t>(t) * nh + h) * D;
      double mx = -1e300;
      for (int j = lo; j <= p; ++j) {
        const double* kr = Kd[s].data() + (static_cast<size_t>(j) * nkv + kvh) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (int j = lo; j <= p; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
      float* o = want.data() + (static_cast<size_t>(t) * nh + h) * D;
      std::vector<double> acc(D, 0.0);
      for (int j = lo; j <= p; ++j) {
        const double* vr = Vd[s].data() + (static_cast<size_t>(j) * nkv + kvh) * D;
        for (int d = 0; d < D; ++d) acc[d] += sc[j] * vr[d];
      }
      for (int d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / sum);
    }
  }

  // Tiles as the backend cuts them.
  const int tpt = kernels::TokensPerTile(G, tc.wide);
  std::vector<int32_t> tile_seq, tile_t0, tile_n;
  for (int s = 0; s < B; ++s)
    for (int i = 0; i < tc.seqs[s].n; i += tpt) {
      tile_seq.push_back(s);
      tile_t0.push_back(seq_first[s] + i);
      tile_n.push_back(std::min(tpt, tc.seqs[s].n - i));
    }

  std::vector<uint16_t> qb(q.size());
  for (size_t i = 0; i < q.size(); ++i) qb[i] = ToBf16(q[i]);
  auto dcache = Upload(cache_host), drows = Upload(rows_host), dq = Upload(qb);
  auto dpos = Upload(pos), dstart = Upload(seq_start), dfirst = Upload(seq_first),
       dtab = Upload(tables), dw = Upload(std::vector<int32_t>{width});
  auto tseq = Upload(tile_seq), tt0 = Upload(tile_t0), tn = Upload(tile_n);
  auto out = Poisoned<uint16_t>(static_cast<size_t>(T) * nh * D);
  auto part_o = Poisoned<float>(static_cast<size_t>(T) * nh * tc.splits * D);
  auto part_ml = Poisoned<float>(static_cast<size_t>(T) * nh * tc.splits * 2);
  kernels::AttentionParams p;
  p.q = dq.get<kernels::bf16_t>();
  p.cache.fp8 = true;
  p.cache.base = dcache.get<kernels::bf16_t>();
  p.cache.block_stride = block_bytes;
  p.cache.layer_offset = layer_offset;
  p.cache.block_size = bs;
  p.cache.tables = dtab.get<int32_t>();
  p.cache.table_stride = dw.get<int32_t>();
  p.fp8_new = kernels::Fp8KvRowsAt(drows.get(), T, nkv, D);
  p.pos = dpos.get<int32_t>();
  p.seq_start = dstart.get<int32_t>();
  p.seq_first = dfirst.get<int32_t>();
  p.tile_seq = tseq.get<int32_t>();
  p.tile_t0 = tt0.get<int32_t>();
  p.tile_n = tn.get<int32_t>();
  p.num_tiles = static_cast<int>(tile_seq.size());
  p.tokens = T;
  p.nh = nh;
  p.nkv = nkv;
  p.head_dim = D;
  p.window = tc.window;
  p.scale = scale;
  p.splits = tc.splits;
  p.wide = tc.wide;
  p.fp8_decode_lean = tc.lean;
  p.part_o = part_o.get<float>();
  p.part_ml = part_ml.get<float>();
  p.out = out.get<kernels::bf16_t>();
  ASSERT_EQ(kernels::LaunchAttention(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = DownloadBf16(out, want.size());
  const double e = RelErr(got, want);
  EXPECT_LT(e, 1e-2) << tc.name;
  // The worst query row too: one wrong tile hides in a long case's average.
  double worst = 0;
  for (int r = 0; r < T * nh; ++r)
    worst = std::max(worst, RelErr(std::span<const float>(got.data() + static_cast<size_t>(r) * D,
                                                          static_cast<size_t>(D)),
                                   std::span<const float>(want.data() + static_cast<size_t>(r) * D,
                                                          static_cast<size_t>(D))));
  EXPECT_LT(worst, 5e-2) << tc.name;
  std::printf("%s: rel err %.2e, worst row %.2e\n", tc.name.c_str(), e, worst);

  // What the fp8 loader has no form for is refused, not run on bf16 rows.
  kernels::AttentionParams no_rows = p;
  no_rows.fp8_new = kernels::Fp8KvRows{};
  EXPECT_EQ(kernels::LaunchAttention(no_rows, nullptr), cudaErrorInvalidValue);
  kernels::AttentionParams mapped = p;
  mapped.kv_map = dcache.get();
  EXPECT_EQ(kernels::LaunchAttention(mapped, nullptr), cudaErrorInvalidValue);
  // Nor more splits than the merge has a form for.
  kernels::AttentionParams too_many = p;
  too_many.splits = kernels::kMaxAttentionSplits + 1;
  EXPECT_EQ(kernels::LaunchAttention(too_many, nullptr), cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(
    Steps, CudaFp8MmaAttention,
    ::testing::Values(
        // Prompt chunks on wide tiles: a chunk starting 4 keys into a block
        // after 4,100 cached tokens, a whole fresh prompt, a short chunk.
        TileCase{"prefill_long_d128", 128, true, 1, 0, 16, {{4100, 100}, {0, 70}, {33, 5}}},
        TileCase{"prefill_long_d64", 64, true, 1, 0, 16, {{4100, 100}, {0, 70}, {33, 5}}},
        TileCase{"prefill_split_d128", 128, true, 3, 0, 16, {{1000, 64}, {5, 3}}},
        TileCase{"prefill_window_d64", 64, true, 1, 40, 16, {{300, 90}, {0, 20}}},
        TileCase{"prefill_block6_d128", 128, true, 2, 0, 6, {{517, 45}, {0, 13}}},
        // Narrow tiles: prompt chunks of several tokens, and decode.
        TileCase{"chunk_narrow_d64", 64, false, 3, 0, 16, {{200, 9}, {0, 6}}},
        TileCase{"decode_long_d64", 64, false, 32, 0, 16, {{4999, 1}, {37, 1}, {0, 1}}},
        // Head_dim 128 decode from one stage up (a first failure says how
        // deep it takes): 41 keys (the fourth warp has none), 2-4 stages a
        // split, a chunk of several tokens.
        TileCase{"decode_one_stage_d128", 128, false, 1, 0, 16, {{40, 1}}},
        TileCase{"decode_stages_d128", 128, false, 2, 0, 16, {{400, 1}, {130, 1}}},
        TileCase{"chunk_narrow_d128", 128, false, 2, 0, 16, {{300, 7}, {0, 4}}},
        TileCase{"decode_long_d128", 128, false, 8, 0, 16, {{6000, 1}, {15, 1}, {16, 1}}},
        TileCase{"decode_one_split_d64", 64, false, 1, 0, 16, {{2048, 1}}},
        TileCase{"decode_window_d128", 128, false, 4, 256, 16, {{3000, 1}, {100, 1}}},
        TileCase{"decode_block6_d64", 64, false, 5, 0, 6, {{1234, 1}, {7, 1}}},
        // More splits than 32 (the merge's wider form): 80 keys a split
        // (not whole stages), and a short sequence whose later splits are
        // empty.
        TileCase{"decode_split64_d64", 64, false, 64, 0, 16, {{4999, 1}, {300, 1}, {0, 1}}},
        TileCase{"decode_split40_d128", 128, false, 40, 0, 16, {{5000, 1}, {3, 1}}},
        // The lean decode form (fp8_decode_lean): the narrow cases above,
        // and the splits its plan gives one sequence (64 at head_dim 64, 49
        // at 128) with empty splits.
        TileCase{"chunk_narrow_d64_lean", 64, false, 3, 0, 16, {{200, 9}, {0, 6}}, true},
        TileCase{"decode_long_d64_lean", 64, false, 32, 0, 16, {{4999, 1}, {37, 1}, {0, 1}}, true},
        TileCase{"decode_one_stage_d128_lean", 128, false, 1, 0, 16, {{40, 1}}, true},
        TileCase{"decode_stages_d128_lean", 128, false, 2, 0, 16, {{400, 1}, {130, 1}}, true},
        TileCase{"chunk_narrow_d128_lean", 128, false, 2, 0, 16, {{300, 7}, {0, 4}}, true},
        TileCase{
            "decode_long_d128_lean", 128, false, 8, 0, 16, {{6000, 1}, {15, 1}, {16, 1}}, true},
        TileCase{"decode_one_split_d64_lean", 64, false, 1, 0, 16, {{2048, 1}}, true},
        TileCase{"decode_window_d128_lean", 128, false, 4, 256, 16, {{3000, 1}, {100, 1}}, true},
        TileCase{"decode_block6_d64_lean", 64, false, 5, 0, 6, {{1234, 1}, {7, 1}}, true},
        TileCase{
            "decode_split64_d64_lean", 64, false, 64, 0, 16, {{4999, 1}, {300, 1}, {0, 1}}, true},
        TileCase{
            "decode_split49_d128_lean", 128, false, 49, 0, 16, {{6000, 1}, {15, 1}, {16, 1}}, true},
        // Prompt tiles ignore it.
        TileCase{"prefill_long_d64_lean", 64, true, 1, 0, 16, {{4100, 100}, {0, 70}}, true}),
    [](const ::testing::TestParamInfo<TileCase>& info) { return info.param.name; });

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaFp8MmaAttention, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
