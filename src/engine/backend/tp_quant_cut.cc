#include "engine/backend/tp_quant_cut.h"

#include <algorithm>
#include <numeric>

namespace agentkv::backend {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t TpCutBlock(int64_t block, int64_t begin, int64_t size, int64_t n, int parts) {
  int64_t b = std::gcd(block, std::gcd(begin, size));
  if (parts > 1) b = std::gcd(b, n / parts);
  return b;
}

Result<model::QuantizedWeight> TpCutQuantized(const model::QuantizedWeight& w, const TensorCut& cut,
                                              const std::string& name) {
  if (cut.kind == TensorCut::Kind::kWhole) return w;
  const std::string what =
      "tensor parallel: " + name + " (" + std::string(model::QuantFormatName(w.format)) + ")";
  if (cut.kind == TensorCut::Kind::kZero)
    return InvalidArgument(what + ": a quantized weight is never a zeroed bias");
  const int nd = static_cast<int>(w.shape.size());
  const bool rows = cut.dim == nd - 2, cols = cut.dim == nd - 1;
  if (nd < 2 || (!rows && !cols))
    return InvalidArgument(what + ": only its rows or columns are cut, not dimension " +
                           std::to_string(cut.dim));
  const int64_t n = rows ? w.rows : w.cols;
  const bool mx = w.format == model::QuantFormat::kMxfp4;
  if (cut.parts < 1 || n % cut.parts != 0 || cut.begin < 0 || cut.size <= 0 ||
      cut.begin >= n / cut.parts || (!mx && cut.begin + cut.size > n / cut.parts))
    return InvalidArgument(what + ": slice [" + std::to_string(cut.begin) + ", " +
                           std::to_string(cut.begin + cut.size) + ") of " +
                           std::to_string(cut.parts) + " parts of " + std::to_string(n) +
                           " is out of range");
  // Padding and zeroed columns: MXFP4 only (TpPlan pads its experts' slices
  // to whole blocks); fp8 cuts stay inside the tensor.
  const bool pads = cut.Masks(n);
  if (pads && !mx)
    return InvalidArgument(what + ": only MXFP4 weights are cut with padding or zeroed columns");
  const int64_t part_n = n / cut.parts, taken = cut.size * cut.parts;
  // The full index of index i of the cut dimension.
  auto src = [&](int64_t i) { return (i / cut.size) * part_n + cut.begin + i % cut.size; };
  // Whether index i of the cut holds a value (not padding, not zeroed).
  auto held = [&](int64_t i) {
    const int64_t local = cut.begin + i % cut.size;
    return local < part_n && local >= cut.keep_begin && local < cut.keep_end;
  };
  // Indices of a part's slice inside the tensor (MXFP4: whole blocks).
  const int64_t inside = std::min(cut.size, part_n - cut.begin);
  if (mx && cols &&
      (cut.begin % model::kMxfp4Block != 0 || cut.size % model::kMxfp4Block != 0 ||
       part_n % model::kMxfp4Block != 0))
    return InvalidArgument(what + ": its input columns [" + std::to_string(cut.begin) + ", " +
                           std::to_string(cut.begin + cut.size) +
                           ") cut an MXFP4 block of 32 (one scale per 32 inputs; a split must "
                           "give each rank whole blocks)");

  model::QuantizedWeight o;
  o.format = w.format;
  o.shape = CutShape(w.shape, cut);
  o.batch = w.batch;
  o.rows = rows ? taken : w.rows;
  o.cols = cols ? taken : w.cols;
  o.block_rows = w.block_rows;
  o.block_cols = w.block_cols;
  // Codes: a byte a value (fp8) or half a byte (MXFP4, [rows][cols / 32][16]:
  // a row's bytes in column order).
  const int64_t den = mx ? 2 : 1;
  const int64_t row_bytes = w.cols / den, out_row_bytes = o.cols / den;
  o.codes.assign(static_cast<size_t>(o.batch * o.rows * out_row_bytes), 0);  // (0: 0.0)
  for (int64_t b = 0; b < w.batch; ++b)
    for (int64_t r = 0; r < o.rows; ++r) {
      if (rows && !held(r)) continue;
      const uint8_t* from = w.codes.data() + (b * w.rows + (rows ? src(r) : r)) * row_bytes;
      uint8_t* to = o.codes.data() + (b * o.rows + r) * out_row_bytes;
      if (rows) {
        std::copy_n(from, row_bytes, to);
        continue;
      }
      for (int p = 0; p < cut.parts; ++p) {
        std::copy_n(from + (p * part_n + cut.begin) / den, inside / den, to + p * cut.size / den);
        if (!pads) continue;
        // Zeroed columns (another rank's, in a shared block): their nibbles
        // (the lower input index in the low nibble).
        for (int64_t j = 0; j < inside; ++j)
          if (!held(j)) to[(p * cut.size + j) / 2] &= (j % 2 == 0) ? 0xF0 : 0x0F;
      }
    }
  switch (w.format) {
    case model::QuantFormat::kMxfp4: {
      const int64_t g = w.cols / model::kMxfp4Block, og = o.cols / model::kMxfp4Block;
      o.exponents.assign(static_cast<size_t>(o.batch * o.rows * og), 0);
      for (int64_t b = 0; b < w.batch; ++b)
        for (int64_t r = 0; r < o.rows; ++r) {
          if (rows && !held(r)) continue;
          const uint8_t* from = w.exponents.data() + (b * w.rows + (rows ? src(r) : r)) * g;
          uint8_t* to = o.exponents.data() + (b * o.rows + r) * og;
          if (rows) {
            std::copy_n(from, g, to);
            continue;
          }
          for (int p = 0; p < cut.parts; ++p)
            std::copy_n(from + (p * part_n + cut.begin) / model::kMxfp4Block,
                        inside / model::kMxfp4Block, to + p * cut.size / model::kMxfp4Block);
        }
      break;
    }
    case model::QuantFormat::kFp8Channel:
      if (!rows) {
        o.scales = w.scales;
        break;
      }
      o.scales.resize(static_cast<size_t>(o.batch * o.rows));
      for (int64_t b = 0; b < w.batch; ++b)
        for (int64_t r = 0; r < o.rows; ++r)
          o.scales[b * o.rows + r] = w.scales[b * w.rows + src(r)];
      break;
    case model::QuantFormat::kFp8Tensor:
      o.scales = w.scales;
      break;
    case model::QuantFormat::kFp8Block: {
      // The refined edge along the cut dimension; each block of the cut
      // takes the scale of the full block holding its first index.
      const int64_t edge =
          TpCutBlock(rows ? w.block_rows : w.block_cols, cut.begin, cut.size, n, cut.parts);
      (rows ? o.block_rows : o.block_cols) = static_cast<int>(edge);
      const int64_t fr = CeilDiv(w.rows, w.block_rows), fc = CeilDiv(w.cols, w.block_cols);
      const int64_t gr = CeilDiv(o.rows, o.block_rows), gc = CeilDiv(o.cols, o.block_cols);
      o.scales.resize(static_cast<size_t>(o.batch * gr * gc));
      for (int64_t b = 0; b < w.batch; ++b)
        for (int64_t i = 0; i < gr; ++i)
          for (int64_t j = 0; j < gc; ++j) {
            const int64_t si = rows ? src(i * edge) / w.block_rows : i;
            const int64_t sj = cols ? src(j * edge) / w.block_cols : j;
            o.scales[(b * gr + i) * gc + j] = w.scales[(b * fr + si) * fc + sj];
          }
      break;
    }
  }
  RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace agentkv::backend
