#include "engine/backend/cpu/cpu_quant_matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/backend/cpu/cpu_kernels.h"

namespace agentkv::backend::cpu {
namespace {

// Weight rows per task on the streaming path: 64 rows of a 4k-wide layer
// are 1 MiB of fp32, about what a core's L2 holds.
constexpr int64_t kTileRows = 64;
// Weight rows per sgemm on the many-rows path: wide enough for OpenBLAS to
// run at speed, small enough to stay in cache next to x.
constexpr int64_t kBigTileRows = 256;

// y = x W^T over W's rows [0, n) handed out by `deq(r0, r1, out)`.
template <typename Deq>
void TiledLinear(const float* x, int64_t n, int64_t k, const Deq& deq, const float* bias, float* y,
                 int64_t m, ThreadPool* pool, QuantScratch& s) {
  const int threads = pool ? pool->size() : 1;
  if (static_cast<int>(s.tiles.size()) < threads) s.tiles.resize(threads);
  if (m <= kernels::kSmallM) {
    // Decode: every task dequantizes its rows and streams them against all
    // of x (few rows), then scatters its columns of y.
    const int64_t tasks = (n + kTileRows - 1) / kTileRows;
    auto run = [&](int64_t t, int thread) {
      const int64_t r0 = t * kTileRows, r1 = std::min(n, r0 + kTileRows), nr = r1 - r0;
      std::vector<float>& buf = s.tiles[thread];
      const int64_t need = kTileRows * (k + m);
      if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
      float* tile = buf.data();
      float* out = tile + nr * k;
      deq(r0, r1, tile);
      kernels::Linear(x, tile, nullptr, out, m, nr, k, nullptr);
      for (int64_t r = 0; r < m; ++r) std::memcpy(y + r * n + r0, out + r * nr, nr * sizeof(float));
    };
    if (pool) {
      pool->ParallelFor(tasks, 1, run);
    } else {
      for (int64_t t = 0; t < tasks; ++t) run(t, 0);
    }
  } else {
    if (static_cast<int64_t>(s.big.size()) < kBigTileRows * k) s.big.resize(kBigTileRows * k);
    for (int64_t r0 = 0; r0 < n; r0 += kBigTileRows) {
      const int64_t r1 = std::min(n, r0 + kBigTileRows), nr = r1 - r0;
      constexpr int64_t kDeqRows = 8;
      auto run = [&](int64_t i, int) {
        const int64_t a = r0 + i * kDeqRows, b = std::min(r1, a + kDeqRows);
        deq(a, b, s.big.data() + (a - r0) * k);
      };
      const int64_t chunks = (nr + kDeqRows - 1) / kDeqRows;
      if (pool) {
        pool->ParallelFor(chunks, 1, run);
      } else {
        for (int64_t i = 0; i < chunks; ++i) run(i, 0);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                  static_cast<int>(nr), static_cast<int>(k), 1.0f, x, static_cast<int>(k),
                  s.big.data(), static_cast<int>(k), 0.0f, y + r0, static_cast<int>(n));
    }
  }
  if (bias) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] += bias[c];
  }
}

}  // namespace

uint64_t QuantMatrix::bytes() const {
  uint64_t total = 0;
  for (const auto& p : parts_) {
    if (const auto* q = std::get_if<model::QuantizedWeight>(&p)) {
      total += q->bytes();
    } else {
      total += std::get<F32Part>(p).w.size() * sizeof(float);
    }
  }
  return total;
}

Status QuantMatrix::Append(model::QuantizedWeight w) {
  RETURN_IF_ERROR(w.Validate());
  if (w.batch != 1) return InvalidArgument("a dense layer's quantized weight must be one matrix");
  if (!parts_.empty() && w.cols != cols_)
    return InvalidArgument("stacked weights differ in input width: " + std::to_string(w.cols) +
                           " vs " + std::to_string(cols_));
  cols_ = w.cols;
  first_row_.push_back(rows_);
  rows_ += w.rows;
  parts_.emplace_back(std::move(w));
  return Status::Ok();
}

Status QuantMatrix::AppendF32(std::vector<float> w, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || static_cast<int64_t>(w.size()) != rows * cols)
    return InvalidArgument("fp32 part: size does not match its shape");
  if (!parts_.empty() && cols != cols_)
    return InvalidArgument("stacked weights differ in input width: " + std::to_string(cols) +
                           " vs " + std::to_string(cols_));
  cols_ = cols;
  first_row_.push_back(rows_);
  rows_ += rows;
  parts_.emplace_back(F32Part{std::move(w)});
  return Status::Ok();
}

void QuantMatrix::DequantizeRows(int64_t r0, int64_t r1, float* out) const {
  for (size_t i = 0; i < parts_.size() && r0 < r1; ++i) {
    const int64_t first = first_row_[i];
    const int64_t end = i + 1 < parts_.size() ? first_row_[i + 1] : rows_;
    if (r0 >= end) continue;
    const int64_t a = r0 - first, b = std::min(r1, end) - first;
    if (const auto* q = std::get_if<model::QuantizedWeight>(&parts_[i])) {
      model::DequantizeRows(*q, 0, a, b, out);
    } else {
      std::memcpy(out, std::get<F32Part>(parts_[i]).w.data() + a * cols_,
                  (b - a) * cols_ * sizeof(float));
    }
    out += (b - a) * cols_;
    r0 = first + b;
  }
}

void QuantLinear(const float* x, const QuantMatrix& w, const float* bias, float* y, int64_t m,
                 ThreadPool* pool, QuantScratch& scratch) {
  TiledLinear(
      x, w.rows(), w.cols(),
      [&](int64_t r0, int64_t r1, float* out) { w.DequantizeRows(r0, r1, out); }, bias, y, m, pool,
      scratch);
}

void QuantLinear(const float* x, const model::QuantizedWeight& w, int64_t b, const float* bias,
                 float* y, int64_t m, ThreadPool* pool, QuantScratch& scratch) {
  TiledLinear(
      x, w.rows, w.cols,
      [&](int64_t r0, int64_t r1, float* out) { model::DequantizeRows(w, b, r0, r1, out); }, bias,
      y, m, pool, scratch);
}

void DenseLinear(const float* x, const std::vector<float>& w, const QuantMatrix& q,
                 const float* bias, float* y, int64_t m, int64_t n, int64_t k, ThreadPool* pool,
                 QuantScratch& scratch) {
  if (q.empty()) {
    kernels::Linear(x, w.data(), bias, y, m, n, k, pool);
  } else {
    QuantLinear(x, q, bias, y, m, pool, scratch);
  }
}

}  // namespace agentkv::backend::cpu
