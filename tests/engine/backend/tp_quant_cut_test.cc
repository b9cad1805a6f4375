// TpCutQuantized: a rank's cut of a quantized weight dequantizes to exactly
// the slice of the full weight's dequantized values, for every format,
// rows and columns, cuts on and off the fp8 block grid (the shared
// boundary block's refined grid), ragged edge blocks, fused parts and
// batches of experts; what cannot be cut is refused naming the tensor.
#include "engine/backend/tp_quant_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/model/quant_pack.h"

namespace agentkv::backend {
namespace {

using Vec = std::vector<float>;

Vec RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Vec v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  // Rows and blocks of very different magnitudes, so that a scale taken
  // from the wrong block shows.
  for (size_t i = 0; i < v.size(); ++i) v[i] *= static_cast<float>(1 + (i * 7919 % 13));
  return v;
}

// `batch` random matrices of rows x cols, stored in `format` (fp8 block
// tiles of br x bc).
model::QuantizedWeight Pack(model::QuantFormat format, int64_t batch, int64_t rows, int64_t cols,
                            int br = 0, int bc = 0, uint32_t seed = 1) {
  const Vec v = RandomValues(batch * rows * cols, seed);
  model::QuantizedWeight w;
  w.format = format;
  w.shape = batch > 1 ? std::vector<int64_t>{batch, rows, cols} : std::vector<int64_t>{rows, cols};
  w.batch = batch;
  w.rows = rows;
  w.cols = cols;
  const int64_t n = rows * cols;
  w.codes.resize(
      static_cast<size_t>(format == model::QuantFormat::kMxfp4 ? batch * n / 2 : batch * n));
  for (int64_t b = 0; b < batch; ++b) {
    const float* m = v.data() + b * n;
    switch (format) {
      case model::QuantFormat::kMxfp4:
        w.exponents.resize(static_cast<size_t>(batch * n / model::kMxfp4Block));
        model::PackMxfp4(m, rows, cols, w.codes.data() + b * n / 2,
                         w.exponents.data() + b * n / model::kMxfp4Block);
        break;
      case model::QuantFormat::kFp8Block: {
        w.block_rows = br;
        w.block_cols = bc;
        const int64_t g = ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
        w.scales.resize(static_cast<size_t>(batch * g));
        model::PackFp8Block(m, rows, cols, br, bc, w.codes.data() + b * n, w.scales.data() + b * g);
        break;
      }
      case model::QuantFormat::kFp8Channel:
        w.scales.resize(static_cast<size_t>(batch * rows));
        model::PackFp8Channel(m, rows, cols, w.codes.data() + b * n, w.scales.data() + b * rows);
        break;
      case model::QuantFormat::kFp8Tensor: {
        float amax = 0;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(m[i]));
        w.scales.push_back(amax / 448.f);
        for (int64_t i = 0; i < n; ++i)
          w.codes[b * n + i] = model::F32ToE4m3(m[i] / w.scales.back());
        break;
      }
    }
  }
  EXPECT_TRUE(w.Validate().ok()) << w.Validate().ToString();
  return w;
}

Vec Dequantized(const model::QuantizedWeight& w) {
  Vec out(static_cast<size_t>(w.batch * w.rows * w.cols));
  for (int64_t b = 0; b < w.batch; ++b)
    model::DequantizeRows(w, b, 0, w.rows, out.data() + b * w.rows * w.cols);
  return out;
}

TensorCut Cut(int dim, int64_t begin, int64_t size, int parts = 1) {
  return {TensorCut::Kind::kSlice, dim, begin, size, parts};
}

// The cut's values are exactly the full weight's slice.
void ExpectCutIsTheSlice(const model::QuantizedWeight& w, const TensorCut& cut, const char* what) {
  auto got = TpCutQuantized(w, cut, "w");
  ASSERT_TRUE(got.ok()) << what << ": " << got.status().ToString();
  EXPECT_TRUE(got->Validate().ok()) << what;
  EXPECT_EQ(got->shape, CutShape(w.shape, cut)) << what;
  const Vec full = Dequantized(w);
  EXPECT_EQ(Dequantized(*got), CutTensor<float>(full, w.shape, cut))
      << what << ": dim " << cut.dim << " [" << cut.begin << ", +" << cut.size << ") x "
      << cut.parts;
}

TEST(TpQuantCutTest, CutBlockIsTheLargestEdgeInsideOneFullBlock) {
  EXPECT_EQ(TpCutBlock(128, 0, 256, 0, 1), 128);    // on the grid
  EXPECT_EQ(TpCutBlock(128, 256, 256, 0, 1), 128);  // on the grid
  EXPECT_EQ(TpCutBlock(128, 192, 192, 0, 1), 64);   // Qwen3-30B-A3B's experts at 4
  EXPECT_EQ(TpCutBlock(128, 0, 192, 0, 1), 64);     // every rank alike
  EXPECT_EQ(TpCutBlock(128, 144, 144, 0, 1), 16);
  EXPECT_EQ(TpCutBlock(128, 0, 128, 320, 2), 32);  // fused parts of 160 rows
  EXPECT_EQ(TpCutBlock(24, 16, 16, 0, 1), 8);
}

TEST(TpQuantCutTest, Fp8BlockCutsOnAndOffTheGrid) {
  // 2 experts of 320 x 288 in tiles of 128 x 96 (ragged last row of
  // tiles), and 24 x 32 tiles (ragged both ways).
  for (auto [br, bc] : {std::pair{128, 96}, std::pair{24, 32}}) {
    const model::QuantizedWeight w = Pack(model::QuantFormat::kFp8Block, 2, 320, 288, br, bc);
    for (const TensorCut& c : {Cut(1, 0, 160), Cut(1, 160, 160), Cut(1, 128, 128), Cut(1, 80, 80),
                               Cut(1, 240, 80), Cut(1, 32, 96, /*parts=*/2), Cut(2, 0, 144),
                               Cut(2, 144, 144), Cut(2, 96, 96), Cut(2, 48, 48)})
      ExpectCutIsTheSlice(w, c, "fp8 block");
    // On the grid the blocks stay; off it the rank's grid is refined to
    // blocks inside one full block each.
    auto on = TpCutQuantized(w, Cut(1, 0, 2 * br), "w");
    ASSERT_TRUE(on.ok());
    EXPECT_EQ(on->block_rows, br);
    EXPECT_EQ(on->scales.size(), 2u * 2 * ((288 + bc - 1) / bc));
    auto off = TpCutQuantized(w, Cut(2, 144, 144), "w");
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(off->block_rows, br);
    EXPECT_EQ(off->block_cols, TpCutBlock(bc, 144, 144, 0, 1));
  }
  // A dense [out, in] weight (no batch dimension).
  const model::QuantizedWeight d = Pack(model::QuantFormat::kFp8Block, 1, 192, 160, 128, 128);
  for (const TensorCut& c : {Cut(0, 96, 96), Cut(0, 64, 64), Cut(1, 80, 80), Cut(1, 0, 32)})
    ExpectCutIsTheSlice(d, c, "fp8 block dense");
}

TEST(TpQuantCutTest, Fp8ChannelAndTensorScalesFollowTheirRows) {
  for (model::QuantFormat f : {model::QuantFormat::kFp8Channel, model::QuantFormat::kFp8Tensor}) {
    const model::QuantizedWeight w = Pack(f, 3, 96, 64);
    for (const TensorCut& c :
         {Cut(1, 0, 48), Cut(1, 48, 48), Cut(1, 8, 24, 2), Cut(2, 16, 16), Cut(2, 32, 32)})
      ExpectCutIsTheSlice(w, c, f == model::QuantFormat::kFp8Channel ? "channel" : "tensor");
  }
}

TEST(TpQuantCutTest, Mxfp4RowsAnywhereColumnsInWholeBlocks) {
  // GPT-OSS-like: 3 experts, gate_up [E, 2I, H] and down [E, H, I].
  const model::QuantizedWeight gu = Pack(model::QuantFormat::kMxfp4, 3, 256, 64);
  for (const TensorCut& c : {Cut(1, 0, 128), Cut(1, 128, 128), Cut(1, 64, 64), Cut(1, 2, 6)})
    ExpectCutIsTheSlice(gu, c, "mxfp4 rows");
  const model::QuantizedWeight down = Pack(model::QuantFormat::kMxfp4, 3, 64, 128);
  for (const TensorCut& c : {Cut(2, 0, 64), Cut(2, 64, 64), Cut(2, 96, 32)})
    ExpectCutIsTheSlice(down, c, "mxfp4 columns");
  // Half a block to each of two ranks (GPT-OSS's 2880 at 4 would be 720).
  for (const TensorCut& c : {Cut(2, 48, 48), Cut(2, 16, 32), Cut(2, 32, 16)}) {
    auto r = TpCutQuantized(down, c, "model.layers.0.mlp.experts.down_proj");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("model.layers.0.mlp.experts.down_proj"), std::string::npos);
    EXPECT_NE(r.status().message().find("MXFP4 block of 32"), std::string::npos)
        << r.status().ToString();
  }
}

// MXFP4 cuts of whole blocks around a slice that cuts a block (TpPlan's
// padded expert split): the columns another rank owns and the padding past
// the tensor are zeros, everything else the full weight's.
TEST(TpQuantCutTest, Mxfp4PaddedCutsZeroWhatTheRankDoesNotOwn) {
  const model::QuantizedWeight down = Pack(model::QuantFormat::kMxfp4, 3, 64, 96);
  const model::QuantizedWeight gu = Pack(model::QuantFormat::kMxfp4, 3, 192, 64);
  auto keep = [](TensorCut c, int64_t b, int64_t e) {
    c.keep_begin = b;
    c.keep_end = e;
    return c;
  };
  // 96 over 4 ranks (24 each), 64 columns held: [0, 64) keeping [24, 48);
  // [64, 128) keeping [72, 96), its last block padding.
  ExpectCutIsTheSlice(down, keep(Cut(2, 0, 64), 24, 48), "down, rank 1");
  ExpectCutIsTheSlice(down, keep(Cut(2, 64, 64), 72, 96), "down, rank 3 (padded)");
  ExpectCutIsTheSlice(down, keep(Cut(2, 32, 64), 49, 75), "down, odd boundaries");
  // gate_up rows (pairs): padded past 2 x 96 rows.
  ExpectCutIsTheSlice(gu, Cut(1, 128, 128), "gate_up, rank 3 (padded)");
  auto padded = TpCutQuantized(gu, Cut(1, 128, 128), "w");
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded->rows, 128);
  // fp8 weights are never padded or masked.
  const model::QuantizedWeight f = Pack(model::QuantFormat::kFp8Block, 1, 64, 64, 32, 32);
  auto r = TpCutQuantized(f, keep(Cut(1, 0, 32), 8, 32), "model.x.weight");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("only MXFP4"), std::string::npos) << r.status().ToString();
}

TEST(TpQuantCutTest, WholeIsACopyAndBadCutsAreRefused) {
  const model::QuantizedWeight w = Pack(model::QuantFormat::kFp8Block, 2, 64, 64, 32, 32);
  auto whole = TpCutQuantized(w, TensorCut{}, "w");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->codes, w.codes);
  EXPECT_EQ(whole->scales, w.scales);
  auto msg = [&](const TensorCut& c) {
    auto r = TpCutQuantized(w, c, "model.x.weight");
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(msg(TensorCut{TensorCut::Kind::kZero}).find("model.x.weight"), std::string::npos);
  EXPECT_NE(msg(Cut(0, 0, 1)).find("not dimension 0"), std::string::npos);  // the experts
  EXPECT_NE(msg(Cut(1, 48, 32)).find("out of range"), std::string::npos);
  EXPECT_NE(msg(Cut(2, 0, 0)).find("out of range"), std::string::npos);
  EXPECT_NE(msg(Cut(1, 0, 16, 3)).find("out of range"), std::string::npos);  // 64 / 3
}

}  // namespace
}  // namespace agentkv::backend
