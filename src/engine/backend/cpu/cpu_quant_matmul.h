// Linear layers whose weights stay quantized in memory (FP8, MXFP4; see
// engine/model/quant_format.h): the matmul dequantizes a tile of weight rows
// at a time into fp32 scratch and multiplies it (the streaming kernel of
// cpu_kernels for decode-sized batches, OpenBLAS sgemm per tile otherwise).
// No full fp32 copy of a matrix ever exists.
//
// Thread-safety: QuantMatrix is immutable once built and may be read
// concurrently; QuantLinear uses `pool` and `scratch`, so one call at a time
// per scratch.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "engine/model/quant_format.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace agentkv::backend::cpu {

// A dense layer's weight as parts stacked along the output dimension (q | k |
// v, gate | up): each quantized as stored, or fp32 rows where a part is not
// quantized (a module a checkpoint leaves unconverted).
class QuantMatrix {
 public:
  bool empty() const { return parts_.empty(); }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Bytes held (codes, scales, fp32 parts).
  uint64_t bytes() const;

  // Appends a part of batch 1; InvalidArgument on a batched weight, an
  // invalid one, or one whose input width differs from the parts before it.
  Status Append(model::QuantizedWeight w);
  // Appends fp32 rows (`rows` x cols(), or the width of the first part).
  Status AppendF32(std::vector<float> w, int64_t rows, int64_t cols);

  // Rows [r0, r1) of the stacked matrix, dequantized, into out[(r1 - r0) * cols()].
  void DequantizeRows(int64_t r0, int64_t r1, float* out) const;

 private:
  struct F32Part {
    std::vector<float> w;
  };
  std::vector<std::variant<model::QuantizedWeight, F32Part>> parts_;
  std::vector<int64_t> first_row_;  // per part
  int64_t rows_ = 0, cols_ = 0;
};

// Per-thread tiles for QuantLinear; grown on first use, then reused.
struct QuantScratch {
  std::vector<std::vector<float>> tiles;  // per pool thread
  std::vector<float> big;                 // the sgemm path's tile
};

// y[m][rows] = x[m][cols] W^T (+ bias[rows]) for a stacked matrix.
void QuantLinear(const float* x, const QuantMatrix& w, const float* bias, float* y, int64_t m,
                 ThreadPool* pool, QuantScratch& scratch);
// The same for matrix `b` of a batched (per-expert) weight.
void QuantLinear(const float* x, const model::QuantizedWeight& w, int64_t b, const float* bias,
                 float* y, int64_t m, ThreadPool* pool, QuantScratch& scratch);

// A dense layer in either form: fp32 rows `w` ([n][k]) when `q` is empty,
// else the quantized matrix (n x k).
void DenseLinear(const float* x, const std::vector<float>& w, const QuantMatrix& q,
                 const float* bias, float* y, int64_t m, int64_t n, int64_t k, ThreadPool* pool,
                 QuantScratch& scratch);

}  // namespace agentkv::backend::cpu
