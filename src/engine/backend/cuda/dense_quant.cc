// CudaBackend's dense projections stored fp8 (Qwen3-*-FP8 and other block
// checkpoints, compressed-tensors per-channel or per-tensor): loaded as
// stored, with each part's scales expanded to one per row and block of
// columns (so that parts stack and gate and up rows interleave whatever
// their block grids), and run on the MoE kernels' one-group form, which
// dequantizes as it reads (kernels/moe.h), or for many-token steps
// dequantized into a bf16 scratch for the bf16 GEMMs (kernels/dequant.h).
#include <algorithm>
#include <string>
#include <vector>

#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/backend_layer.h"
#include "engine/backend/cuda/kernels/dequant.h"
#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/status.h"

namespace agentkv::backend::cuda {

Status CudaBackend::LoadQuantDense(const model::WeightSource& w,
                                   const std::vector<std::string>& names,
                                   const std::vector<std::vector<int64_t>>& shapes,
                                   bool interleave_rows, QuantDense* out) {
  if (names.empty() || names.size() != shapes.size())
    return InvalidArgument("LoadQuantDense: a shape per name");
  if (interleave_rows && (names.size() != 2 || shapes[0] != shapes[1]))
    return InvalidArgument("LoadQuantDense: rows interleave two matrices of one shape");
  std::vector<model::QuantizedWeight> parts;
  int64_t rows = 0;
  const int64_t cols = shapes[0].back();
  for (size_t i = 0; i < names.size(); ++i) {
    if (!w.IsQuantized(names[i]))
      return Unimplemented("cuda backend: " + names[i] + " is not quantized while " + names[0] +
                           " is: the parts of a projection must be stored alike");
    ASSIGN_OR_RETURN(model::QuantizedWeight q, w.LoadQuantized(names[i], shapes[i], config_.quant));
    if (q.format == model::QuantFormat::kMxfp4 || q.batch != 1 || q.cols != cols)
      return Unimplemented("cuda backend: " + names[i] + " is " +
                           std::string(model::QuantFormatName(q.format)) +
                           "; dense projections read fp8 (block, channel or tensor scales)");
    rows += q.rows;
    parts.push_back(std::move(q));
  }
  // Columns per scale: the block format's (alike in every block part, a
  // multiple of 16 so that no 16-byte load straddles two blocks), else one
  // block of the whole row rounded up to 16 (channel and tensor scales).
  int bc = 0;
  for (const model::QuantizedWeight& q : parts) {
    if (q.format != model::QuantFormat::kFp8Block) continue;
    if (q.block_cols % 16 != 0 || (bc != 0 && bc != q.block_cols))
      return Unimplemented("cuda backend: " + names[0] +
                           ": fp8 blocks of whole 16 columns, alike in every part");
    bc = q.block_cols;
  }
  if (bc == 0) bc = static_cast<int>((cols + 15) / 16 * 16);
  if (kernels::ChooseMoeGemmPath(1, 1, 1, static_cast<int>(rows), static_cast<int>(cols),
                                 kernels::MoeWeightFormat::kFp8Block) ==
      kernels::MoeGemmPath::kUnsupported)
    return Unimplemented("cuda backend: " + names[0] + ": quantized inputs of " +
                         std::to_string(cols) + " are not whole 16-value loads");
  const int64_t nkb = (cols + bc - 1) / bc;
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(rows * nkb));
  int64_t first = 0;  // the part's first row in the stacked matrix
  for (size_t i = 0; i < parts.size(); ++i) {
    const model::QuantizedWeight& q = parts[i];
    for (int64_t r = 0; r < q.rows; ++r) {
      // Where row r of part i goes: stacked after the earlier parts, or
      // interleaved (gate r at 2r, up r at 2r + 1).
      const int64_t at = interleave_rows ? 2 * r + static_cast<int64_t>(i) : first + r;
      std::copy_n(q.codes.begin() + r * cols, cols, codes.begin() + at * cols);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        float s;
        switch (q.format) {
          case model::QuantFormat::kFp8Block:
            s = q.scales[(r / q.block_rows) * ((cols + q.block_cols - 1) / q.block_cols) + kb];
            break;
          case model::QuantFormat::kFp8Channel:
            s = q.scales[r];
            break;
          default:  // per tensor
            s = q.scales[0];
            break;
        }
        scales[at * nkb + kb] = s;
      }
    }
    first += q.rows;
  }
  void* ptr = nullptr;
  RETURN_IF_ERROR(UploadHost(codes.data(), codes.size(), &ptr));
  out->codes = static_cast<const uint8_t*>(ptr);
  RETURN_IF_ERROR(UploadHost(scales.data(), scales.size() * sizeof(float), &ptr));
  out->scales = static_cast<const float*>(ptr);
  out->block_cols = bc;
  out->n = static_cast<int>(rows);
  out->k = static_cast<int>(cols);
  return Status::Ok();
}

Status CudaBackend::QuantGemm(const kernels::bf16_t* x, const QuantDense& w, void* y, bool y_f32,
                              bool accumulate, int m, bool gated) {
  if (m <= 0) return Status::Ok();
  kernels::MoeGemmParams g;
  g.x = x;
  g.format = kernels::MoeWeightFormat::kFp8Block;
  g.wq = w.codes;
  g.scales = w.scales;
  g.block_rows = 1;  // (a scale per row)
  g.block_cols = w.block_cols;
  g.N = w.n;
  g.K = w.k;
  g.rows = m;
  g.max_group_rows = m;
  if (gated) {
    // (The gated form every gate_up path of the model applies.)
    g.epilogue = kernels::MoeGatedEpilogue(cuda::DenseGatedForm(gemm_));
    g.act = static_cast<kernels::bf16_t*>(y);
  } else if (y_f32) {
    g.epilogue = kernels::MoeEpilogue::kStore;
    g.y = static_cast<float*>(y);
    g.accumulate = accumulate;
  } else {
    g.epilogue = kernels::MoeEpilogue::kStoreBf16;
    g.act = static_cast<kernels::bf16_t*>(y);
  }
  // One group of m rows: the GEMV for decode-sized steps, the tiles else.
  g.path = kernels::ChooseMoeGemmPath(m, 1, 1, g.N, g.K, g.format, options_.tuning.moe_gemv);
  CUDA_RETURN_IF_ERROR(kernels::LaunchMoeGemm(g, launch_));
  return Status::Ok();
}

Result<const kernels::bf16_t*> CudaBackend::Dequantize(const QuantDense& w) {
  if (static_cast<size_t>(w.n) * w.k * 2 > dequant_.bytes())
    return Internal("cuda: a dequantized projection of " + std::to_string(w.n) + " x " +
                    std::to_string(w.k) + " does not fit the scratch");
  auto* out = dequant_.get<kernels::bf16_t>();
  CUDA_RETURN_IF_ERROR(
      kernels::LaunchDequantFp8(w.codes, w.scales, w.n, w.k, w.block_cols, out, launch_));
  return out;
}

}  // namespace agentkv::backend::cuda
