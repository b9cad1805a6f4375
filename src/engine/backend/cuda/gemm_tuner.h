// Prompt-sized GEMMs through cuBLASLt with the fastest of its heuristic's
// candidates, timed on this GPU. cublasGemmEx takes the heuristic's first
// candidate, which for the prompt steps' shapes on an H100 was not the
// fastest (random bf16 data, 8,192 rows: gate_up 771 -> 744 us, QKV 138 ->
// 133; bench/RESULTS.md, CUDA log item 68). The backend tunes those two;
// the o and down projections' gains alone did not carry into the steps.
//
// y[m][n] = x[m][k] . w[n][k]^T (+ beta * y), x and w bf16, y bf16 or fp32,
// fp32 accumulation: the same GEMM as CudaBackend::Gemm's cuBLAS path.
// Tune() times each candidate at one row count (an anchor); Run() uses the
// algorithm chosen at the smallest anchor of at least m rows, so a few
// anchors (powers of two and the capacity) cover every row count.
//
// Not thread-safe: the engine thread owns it (with the stream it was given).
// Tune() synchronises the stream; Run() only enqueues, allocates nothing
// and may be captured in a CUDA graph.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <tuple>

#include "engine/backend/cuda/kernels/launch.h"
#include "util/status.h"

namespace agentkv::backend::cuda {

class GemmTuner {
 public:
  GemmTuner() = default;
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;
  ~GemmTuner();

  // ws: a device workspace of ws_bytes that every call may use (it is also
  // cuBLAS's: both run on `stream`, in order). log: Tune prints each
  // decision (default and best time, candidate) to stderr
  // (CudaTuning::gemm_tune_log).
  Status Init(cudaStream_t stream, void* ws, size_t ws_bytes, bool log);

  // Times cublasGemmEx's default and each heuristic candidate for this GEMM
  // at m rows (x, w and y must hold m x k, n x k and m x n elements, y is
  // overwritten or, beta != 0, accumulated into) and keeps the fastest for
  // the anchor m; a candidate must beat the default by 2% (the run-to-run
  // spread) to replace it. `cublas` must be on the same stream and
  // workspace. Synchronises the stream. Tuning an anchor again is a no-op.
  Status Tune(cublasHandle_t cublas, const kernels::bf16_t* x, const kernels::bf16_t* w, void* y,
              bool y_f32, int m, int n, int k, float beta);

  // Enqueues the GEMM with the algorithm tuned at the smallest anchor of at
  // least m rows and sets *ran; *ran false (nothing enqueued): no anchor
  // covers m, the default won there, or the algorithm does not take m rows,
  // and the caller runs cublasGemmEx.
  Status Run(const kernels::bf16_t* x, const kernels::bf16_t* w, void* y, bool y_f32, int m, int n,
             int k, float beta, bool* ran);

  // cuBLAS's own choice for the same GEMM (cublasGemmEx), on `cublas`'s
  // stream and workspace: what Tune measures against and callers run when
  // Run declines.
  static cublasStatus_t Default(cublasHandle_t cublas, const kernels::bf16_t* x,
                                const kernels::bf16_t* w, void* y, bool y_f32, int m, int n, int k,
                                float beta);

  // Anchors tuned so far whose choice is not the default (for logs, tests).
  int tuned_non_default() const;

 private:
  struct Entry {
    bool use_default = true;
    cublasLtMatmulAlgo_t algo{};
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  };
  // (n, k, y_f32, beta != 0, anchor rows)
  using Key = std::tuple<int, int, bool, bool, int>;

  cudaStream_t stream_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  bool log_ = false;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  std::map<Key, Entry> entries_;
};

}  // namespace agentkv::backend::cuda
