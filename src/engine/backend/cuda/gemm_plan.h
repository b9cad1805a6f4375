// Which kernel runs each matrix product of a CUDA step, decided from the
// step's row count and a few facts about the model, the device and the
// tuning: plain data, so the choices are tested without a GPU
// (tests/engine/backend/cuda/gemm_plan_test.cc). CudaBackend::Enqueue
// launches what PlanDenseLayer and PlanLmHead say; CudaBackend::Gemm (every
// other product: MoE, fp8, tensor parallelism, warm-up) what ChooseGemm
// says. The kernels' own shape rules come from kernels/gemm_route.h.
//
// By rows (the defaults; GemmModel carries the switches):
// - 1 and 2 rows (kGemvMaxRows): the weight-streaming GEMVs, the QKV
//   projection with the RMSNorm fused in (hidden size and outputs up to
//   4,096), gate_up with the gated activation in its epilogue and the
//   MLP's norm fused in too where CudaTuning::gemv_pipe is on and no
//   sandwich norm came before.
// - from GemmModel::wgmma_min_rows to 64 rows: the warpgroup GEMM where its
//   plan needs no split K, gate_up with the activation in its epilogue; the
//   o and down projections, and the decode QKV projection, with K split
//   into fp32 planes that the next norm or the decode attention adds; the
//   LM head from 3 rows with the argmax in its epilogue.
// - more than 64 rows: gate_up on the persistent prompt GEMM with the
//   activation in its epilogue; the LM head from 8 rows on it with the
//   argmax in its epilogue.
// - the rest on cuBLAS (tuned per shape from kTuneMinRows rows).
//
// Pure functions; thread-compatible. No CUDA headers.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "engine/backend/cuda/kernels/gated_act.h"

namespace agentkv::backend::cuda {

// Up to this many rows the GEMMs run on the weight-streaming GEMVs: the
// GEMV beat cuBLAS at 1 row (c1 655 -> 683 tok/s) but lost at 8 (c8 3833
// -> 3210: its x reads from shared memory grow with the rows).
inline constexpr int kGemvMaxRows = 2;
// Rows from which the LM head runs on the prompt GEMM (measured from 8:
// 184 against 190 us for the warpgroup GEMM; fewer not measured).
inline constexpr int kPromptArgmaxMinRows = 8;
// Row counts from which cuBLAS takes GemmTuner's choice (the prompt
// steps'; decode steps and their graphs keep cuBLAS's default).
inline constexpr int kTuneMinRows = 512;

// Facts the choices follow; constant for a backend once created.
struct GemmModel {
  int hidden = 0;  // H
  int qkv_n = 0;   // (heads + 2 * kv_heads) * head_dim
  int attn_n = 0;  // heads * head_dim: the o projection's k
  int inter = 0;   // I: gate_up is 2I x H, down H x I
  int vocab = 0;
  int num_sms = 1;
  // Rows from which the warpgroup GEMM runs (cuda::WgmmaMinRows; kNeverRows
  // off compute capability 9.0).
  int wgmma_min_rows = 1 << 30;
  // The persistent prompt GEMM: CudaTuning::prompt_gemm and a device that
  // has it (PromptGemmDeviceSupported).
  bool prompt_gemm = false;
  // CudaTuning's switches.
  bool lm_argmax = true;
  bool prompt_argmax = true;
  bool gemv_pipe = true;
  bool softcap = false;        // the LM head's logits are soft-capped
  bool sandwich_norm = false;  // norms after attention and the MLP (Gemma 3)
  bool tp = false;             // tensor parallelism: partial sums, all-reduced
  // Quantized (fp8) dense projections: whether many-token steps may
  // dequantize them into the backend's bf16 scratch (CudaTuning::
  // dense_dequant and a scratch allocated), and whether decode-sized steps
  // take the quantized GEMV (CudaTuning::moe_gemv).
  bool quant_dequant = false;
  bool quant_gemv = true;
  // The dense MLP's activation is GELU, tanh form (Gemma 3), not SiLU.
  bool gelu_mlp = false;
};

// The gated product of a dense layer's gate_up, which every path applies
// alike: the bf16 kernels' activation (0 SiLU, 1 GELU) and the quantized
// kernels' gated epilogue (CudaBackend::QuantGemm) compute it with
// kernels/gated_act.h.
kernels::GatedForm DenseGatedForm(const GemmModel& g);

// What CudaBackend::Gemm runs an m-row [n][k] product on.
enum class GemmKernel : uint8_t {
  kGemv,    // kernels::LaunchGemv
  kWgmma,   // kernels::LaunchWgmmaGemm, one split
  kCublas,  // cuBLAS at CublasRows(m), GemmTuner's choice from kTuneMinRows
};
GemmKernel ChooseGemm(const GemmModel& g, int m, int n, int k);
// The warpgroup GEMM for m rows of [n][k] (plans without split K: with it
// the last block's reduction made the o, QKV and down projections slower
// than cuBLAS; bench/RESULTS.md item 44).
bool UseWgmma(const GemmModel& g, int m, int n, int k);
// The row count cuBLAS runs a GEMM of m rows on: a multiple of 8 up to 64
// rows, of 16 up to 256 (the decode graph buckets stay as they are), of 64
// beyond (at most 63 rows more, under 4% of the work of a full 2,048-token
// step), and at most max_rows (what x and y hold) unless m is more.
int GemmRows(int m);
int CublasRows(int m, int64_t max_rows);
// The split-K planes an m-row [n][k] product leaves for the next kernel to
// add (AddPartsRmsNorm, or the decode attention for QKV); 0: none.
int PlanesFor(const GemmModel& g, int m, int n, int k);
// gate_up (n = 2 * inter) of m rows on the prompt GEMM with the activation
// in its epilogue (more than kMaxWgmmaRows rows).
bool UsePromptGemm(const GemmModel& g, int m, int n, int k);

// Rows up to which a quantized dense projection stays on the quantized GEMV
// where the dequantized path is available (UseDequantGemm); from one more
// it is dequantized. Measured on an H200 (Qwen3-8B FP8, bench/RESULTS.md,
// "FP8 dense layers of many-token steps dequantized"): a step of 17
// sequences on the dequantized weights took 13.4 ms, one of 16 on the GEMV
// 15.2 ms, and the GEMV's step time grows with its rows from 5.7 ms at 1,
// so the two meet at about 12-13 rows. (The GEMV runs its rows in passes
// of a power of two, so 9-16 rows cost about one 16-row pass; decode graphs
// pad 9-16 sequences to the bucket of 16 and so take the dequantized path
// from 9 sequences on either side of this value.)
inline constexpr int kDenseQuantGemvMaxRows = 12;

// Whether an m-row product with a quantized dense weight [n][k] runs as
// "dequantize the weight to bf16 into the scratch, then the bf16 plan"
// (ChooseGemm, PlanDenseLayer's paths) rather than on the quantized kernels
// (CudaBackend::QuantGemm): past kDenseQuantGemvMaxRows rows, and wherever
// the quantized kernels would take the tensor cores' tiles (the quantized
// GEMV off, or a shape whose x it cannot hold). Roofline: the dequantized
// path moves 5 bytes a weight (1 read, 2 written, 2 read back by the GEMM),
// ~10 ms a step for Qwen3-8B at ~3.5 TB/s whatever the rows up to the
// GEMM's compute bound, where the tiles read their fp8 weights at ~75 GB/s
// (578 tok/s at 64 sequences on an H200); the GEMV reads 1 byte a weight a
// pass (up to 16 rows) and stays for few rows. The same rounding either
// way: the tiles also multiply bf16(code * scale).
bool UseDequantGemm(const GemmModel& g, int m, int n, int k);
// The bf16 values the scratch must hold for a model whose quantized dense
// projections are `shapes` ({n, k} each): the largest, dequantized one
// projection at a time; 0 for none.
int64_t DequantScratchElems(std::span<const std::array<int64_t, 2>> shapes);

// The QKV projection of a dense bf16 layer.
enum class QkvPath : uint8_t {
  kWgmmaPlanes,   // Norm, then the warpgroup GEMM's planes for the attention
  kNormGemv,      // the RMSNorm fused in the GEMV
  kNormThenGemm,  // Norm, then Gemm (ChooseGemm)
};
// The residual-adding projections (o, down: x += a . w^T).
enum class ResidualPath : uint8_t {
  kPlanes,       // the warpgroup GEMM's split-K planes, added by the next norm
  kGemmAdd,      // Gemm with beta 1
  kGemmPartial,  // tensor parallelism: Gemm with beta 1 on rank 0, 0 on others
  kGemmOut,      // sandwich norm: Gemm into o_, the norm adds it
};
// Whether a quantized residual projection (o, down: CudaBackend::QuantGemm,
// which no plan routes) adds its product into x rather than storing it:
// as kGemmAdd on one GPU; as kGemmPartial under tensor parallelism (rank 0
// adds onto the residual, every other rank stores its partial sum over x,
// and the all-reduce adds them: were every rank to add, the sum would hold
// the residual once per rank); never with sandwich norms (kGemmOut: o is
// stored, the norm adds it).
bool QuantResidualAdds(const GemmModel& g, int tp_rank);
// gate_up and its gated activation.
enum class GateUpPath : uint8_t {
  kNormGemvAct,  // the MLP's norm, the GEMV and the activation in one kernel
  kGemvAct,      // Norm, then the GEMV with the activation in its epilogue
  kWgmmaAct,     // Norm, then the warpgroup GEMM with it in its epilogue
  kPromptAct,    // Norm, then the prompt GEMM with it in its epilogue
  kGemmThenAct,  // Norm, Gemm into gu_, then LaunchGatedAct
};
// What a dense layer of a step of `tokens` rows runs. Layers whose
// projection is quantized (fp8) take the quantized kernel instead unless
// UseDequantGemm (then the plan holds for the dequantized weight), and
// mixture-of-experts layers their own MLP; the plan holds for the rest.
struct DenseLayerPlan {
  QkvPath qkv = QkvPath::kNormThenGemm;
  int qkv_planes = 0;  // kWgmmaPlanes: the planes the attention adds
  ResidualPath o = ResidualPath::kGemmAdd;
  GateUpPath gate_up = GateUpPath::kGemmThenAct;
  ResidualPath down = ResidualPath::kGemmAdd;
  int o_planes = 0, down_planes = 0;  // kPlanes: the split
};
// fused_rotary: the step's decode attention applies the rotary (RouteStep),
// so QKV stays fp32 and may leave planes; max_qkv_planes: what the
// attention adds (kernels::kMaxQkvPlanes).
DenseLayerPlan PlanDenseLayer(const GemmModel& g, int tokens, bool fused_rotary,
                              int max_qkv_planes);

// The LM head of a step with `rows` logits rows.
enum class LmHeadPath : uint8_t {
  kPromptArgmax,  // Norm, then the prompt GEMM with the argmax in its epilogue
  kWgmmaArgmax,   // Norm, then the warpgroup GEMM with the argmax in its epilogue
  kGemmArgmax,    // NormGemm, softcap, then LaunchArgmax
};
LmHeadPath PlanLmHead(const GemmModel& g, int rows);

}  // namespace agentkv::backend::cuda
