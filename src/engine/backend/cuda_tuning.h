// CudaTuning: every switch of the CUDA backend's kernel choices and
// diagnostics, as plain data. The defaults are the measured best
// (bench/RESULTS.md, CUDA section); the others exist for comparisons and
// diagnostics. The command line fills one from the AGENTKV_CUDA_* variables
// (CudaTuningFromEnv, docs/cuda.md lists them); CudaBackendOptions carries
// it, and the backend passes each choice down to the launchers that need
// it (AttentionParams, LaunchGemv's `pipe`, GemmTuner::Init's `log`,
// LaunchConfig::pdl). Tests set the fields directly.
//
// Also the pure functions that turn a CudaTuning into the backend's row
// thresholds, so that they can be tested without a GPU. No CUDA headers:
// BackendOptions includes this in builds without the CUDA backend.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

namespace agentkv::backend {

struct CudaTuning {
  // Decode steps captured as CUDA graphs, one per batch-size bucket
  // (AGENTKV_CUDA_GRAPHS=0: launched kernel by kernel).
  bool graphs = true;
  // Decode steps' attention applies the rotary and stores the token's K and
  // V itself (AGENTKV_CUDA_FUSED_ROTARY=0: QkvPost runs before attention).
  bool fused_rotary = true;
  // Prompt-sized cuBLAS GEMMs on the algorithm GemmTuner timed fastest
  // (AGENTKV_CUDA_GEMM_TUNE=0: cuBLAS's default choice).
  bool gemm_tune = true;
  // GemmTuner prints each decision to stderr (AGENTKV_CUDA_GEMM_TUNE_LOG set
  // to anything).
  bool gemm_tune_log = false;
  // Rows from which GEMMs run on the warpgroup GEMM (up to kMaxWgmmaRows):
  // kAuto is cuda::kWgmmaMinRows for hidden sizes up to
  // cuda::kWgmmaMaxHidden and never above; a positive count is that many
  // rows for any hidden size; 0 is never (AGENTKV_CUDA_WGMMA=<rows>, a
  // value that is not a positive number: 0). Never off compute capability
  // 9.0 (cuda::WgmmaMinRows).
  static constexpr int kAuto = -1;
  int wgmma_rows = kAuto;
  // The LM head on the warpgroup GEMM (3-64 rows) or the prompt GEMM (8+)
  // with the argmax in its epilogue (AGENTKV_CUDA_LM_ARGMAX=0: cuBLAS, then
  // the argmax kernel).
  bool lm_argmax = true;
  // Prompt steps' gate_up (more than 64 rows) on the persistent warpgroup
  // GEMM with the gated activation in its epilogue; also the condition of
  // prompt_argmax (AGENTKV_CUDA_PROMPT_GEMM=0: cuBLAS, then the activation
  // kernel).
  bool prompt_gemm = true;
  // The LM head of 8+ rows on the prompt GEMM with the argmax in its
  // epilogue (AGENTKV_CUDA_PROMPT_ARGMAX=0: the warpgroup GEMM up to 64
  // rows, cuBLAS and the argmax kernel beyond).
  bool prompt_argmax = true;
  // Prompt steps' attention (wide tiles, head_dim 64, compute capability
  // 9.0) on the warpgroup kernel with TMA page copies
  // (AGENTKV_CUDA_WGMMA_ATTENTION=0: the mma.sync kernel).
  bool wgmma_attention = true;
  // Decode attention (narrow tiles) on the mma.sync kernel where it has the
  // head_dim (AGENTKV_CUDA_MMA_ATTENTION=0: the portable WMMA kernel, and no
  // fused rotary).
  bool mma_attention = true;
  // The pipelined GEMV kernels: the MLP norm, gate_up GEMV and activation in
  // one kernel for 1-2 rows, and GEMVs of k 8,192+ (AGENTKV_CUDA_GEMV_PIPE=0:
  // every shape on the plain GEMV, the norm a kernel of its own).
  bool gemv_pipe = true;
  // Programmatic dependent launch between kernels on sm_90+
  // (AGENTKV_CUDA_PDL=0: plain launches).
  bool pdl = true;
  // Mixture-of-experts GEMMs of decode-sized steps, and fp8 dense ones, on
  // the weight-streaming GEMV where cuda::ChooseMoeGemmPath picks it
  // (AGENTKV_CUDA_MOE_GEMV=0: on the tensor cores' tiles wherever they take
  // the shape).
  bool moe_gemv = true;
  // fp8 dense projections of steps past the quantized GEMV's rows
  // (cuda::UseDequantGemm): dequantized, one projection at a time, into a
  // bf16 scratch the size of the largest (allocated at load, so the KV pool
  // is sized without it), then the bf16 GEMMs (AGENTKV_CUDA_DENSE_DEQUANT=0:
  // the quantized tiles, no scratch).
  bool dense_dequant = true;
  // Decode graphs' attention splits aim at this many blocks per SM
  // (AGENTKV_CUDA_DECODE_BLOCKS_PER_SM=<n>; not a positive number: 4).
  int decode_blocks_per_sm = 4;
  // fp8 KV caches' decode attention on the lean form of the mma.sync kernel
  // (one more block per SM: AttentionParams::fp8_decode_lean), its graphs'
  // splits aimed at the blocks per SM that form fits (at most
  // decode_blocks_per_sm) and up to kernels::kMaxAttentionSplits, not 32
  // (cuda::GraphShape). On: one sequence at 32k keys measured 26.0 us
  // against 34.0 (head_dim 64) and 42.6 against 49.5 (128) on an H200
  // (docs/kv-fp8.md). AGENTKV_CUDA_FP8_DECODE_LEAN=0: the old form, 32
  // splits at most (for comparison).
  bool fp8_decode_lean = true;
  // Appends one line per step to this file: tokens, sequences, graph bucket
  // (0: none), table stride, attention splits, capture ms, device ms
  // (AGENTKV_CUDA_STEP_LOG=<path>; empty: none).
  std::string step_log;
  // With `ncu --profile-from-start off`: the profiler records the 20th and
  // 21st pure decode steps of exactly this many sequences
  // (AGENTKV_CUDA_PROFILE_BATCH=<b>; 0: never).
  int profile_batch = 0;
};

// The CudaTuning the AGENTKV_CUDA_* variables ask for, `lookup` giving a
// variable's value or null where it is unset (std::getenv). Unset
// variables and values a switch does not know keep the defaults, as
// documented per field: never an error, so that a stray variable cannot
// stop a server from starting.
inline CudaTuning CudaTuningFromEnv(const std::function<const char*(const char*)>& lookup) {
  auto get = [&](const char* name) { return lookup(name); };
  // A switch that is on by default: off only for "0".
  auto off = [&](const char* name) {
    const char* v = get(name);
    return v != nullptr && std::string_view(v) == "0";
  };
  auto positive = [&](const char* v) {
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n > 0 ? n : 0;
  };
  CudaTuning t;
  t.graphs = !off("AGENTKV_CUDA_GRAPHS");
  t.fused_rotary = !off("AGENTKV_CUDA_FUSED_ROTARY");
  t.gemm_tune = !off("AGENTKV_CUDA_GEMM_TUNE");
  t.gemm_tune_log = get("AGENTKV_CUDA_GEMM_TUNE_LOG") != nullptr;
  if (const char* v = get("AGENTKV_CUDA_WGMMA"); v != nullptr) t.wgmma_rows = positive(v);
  t.lm_argmax = !off("AGENTKV_CUDA_LM_ARGMAX");
  t.prompt_gemm = !off("AGENTKV_CUDA_PROMPT_GEMM");
  t.prompt_argmax = !off("AGENTKV_CUDA_PROMPT_ARGMAX");
  t.wgmma_attention = !off("AGENTKV_CUDA_WGMMA_ATTENTION");
  t.mma_attention = !off("AGENTKV_CUDA_MMA_ATTENTION");
  t.gemv_pipe = !off("AGENTKV_CUDA_GEMV_PIPE");
  t.pdl = !off("AGENTKV_CUDA_PDL");
  t.moe_gemv = !off("AGENTKV_CUDA_MOE_GEMV");
  t.dense_dequant = !off("AGENTKV_CUDA_DENSE_DEQUANT");
  if (const int n = positive(get("AGENTKV_CUDA_DECODE_BLOCKS_PER_SM")); n > 0)
    t.decode_blocks_per_sm = n;
  t.fp8_decode_lean = !off("AGENTKV_CUDA_FP8_DECODE_LEAN");
  if (const char* v = get("AGENTKV_CUDA_STEP_LOG"); v != nullptr) t.step_log = v;
  if (const char* v = get("AGENTKV_CUDA_PROFILE_BATCH"); v != nullptr && *v != '\0')
    t.profile_batch = std::atoi(v);
  return t;
}

namespace cuda {

// A row threshold no step reaches.
inline constexpr int kNeverRows = 1 << 30;

// Decode steps from this many rows run their GEMMs (but the LM head's) on
// the warpgroup kernel on compute capability 9.0 (bench/RESULTS.md item 44:
// c4 +10%, c8 +9%, c16-c64 +5-10% against cuBLAS); one and two rows keep
// the GEMVs.
inline constexpr int kWgmmaMinRows = 3;
// Above this hidden size the warpgroup GEMM is off unless asked for: on the
// Qwen3-8B shape (4,096) decode steps measured 4-5% slower than cuBLAS.
inline constexpr int kWgmmaMaxHidden = 2048;

// The rows from which the backend's GEMMs take the warpgroup kernel
// (kNeverRows: never), for a model of `hidden_size` on a device that is
// (sm90) or is not of compute capability 9.0.
inline int WgmmaMinRows(const CudaTuning& t, int hidden_size, bool sm90) {
  if (!sm90 || t.wgmma_rows == 0) return kNeverRows;
  if (t.wgmma_rows > 0) return t.wgmma_rows;
  return hidden_size <= kWgmmaMaxHidden ? kWgmmaMinRows : kNeverRows;
}

}  // namespace cuda
}  // namespace agentkv::backend
