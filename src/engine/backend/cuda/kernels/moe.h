// The mixture-of-experts kernels (moe.cu): routing, grouping of the
// assignments by expert, the grouped expert GEMM with the gated activation
// in its epilogue, and the weighted sum of the experts' outputs into the
// residual stream. The decisions are moe_plan.h's pure functions; the CPU
// references are engine/backend/cpu/cpu_moe.h. launch.h says what all
// launchers share. Every size comes from the host except the groups'
// (device memory), so a step's launches are the same whatever the routing:
// they can be captured in graphs.
//
// One layer, T tokens, k experts each, A = T * k assignments:
//   LaunchMoeRouterLogits (fp32)            -> logits [T][E] fp32
//   LaunchMoeRoute                          -> experts, weights [T][k]
//   LaunchMoePlan                           -> offsets, tiles, order, slot_of
//   LaunchMoeGemm (gated, gathered rows)    -> act [A][I] bf16
//   LaunchMoeGemm (plain)                   -> y [A][H] fp32
// (each GEMM on the path ChooseMoeGemmPath picks for the step)
//   LaunchMoeCombine                        -> x [T][H] += sum_j w_j y
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/gated_act.h"
#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/moe_plan.h"

namespace agentkv::backend::cuda::kernels {

// The router's logits from the fp32 residual stream: logits[t][e] =
// RMSNorm(x[t]) . w[e] (+ bias[e]), the norm as LaunchRmsNorm's (weights
// norm_w, or 1 + norm_w with plus_one) but kept in fp32, w [E][H] bf16,
// all in fp32. The experts get the bf16 norm as every GEMM does; the
// routing, a discrete choice, gets the CPU reference's fp32 inputs, so
// that bf16 rounding does not flip near ties between experts. H <=
// kMaxMoeRouterHidden.
inline constexpr int kMaxMoeRouterHidden = 12288;
cudaError_t LaunchMoeRouterLogits(const float* x, const float* norm_w, float eps, bool plus_one,
                                  const bf16_t* w, const float* bias, int tokens, int H, int E,
                                  float* logits, LaunchConfig launch);

// experts / weights [tokens][k] from logits [tokens][num_experts]
// (MoeRouteToken per token). num_experts <= kMaxMoeExperts, k <=
// min(num_experts, kMaxMoeTopK); else cudaErrorInvalidValue.
cudaError_t LaunchMoeRoute(const float* logits, int tokens, int num_experts, int k,
                           bool softmax_first, bool renormalize, int32_t* experts, float* weights,
                           LaunchConfig launch);

// The grouping of the `assignments` expert ids (MoePlanOffsets,
// MoePlanExpert, MoePlanTiles): offsets and tiles [num_experts + 1], order
// and slot_of [assignments]. One block; num_experts <= kMaxMoeExperts.
cudaError_t LaunchMoePlan(const int32_t* experts, int assignments, int num_experts,
                          int32_t* offsets, int32_t* tiles, int32_t* order, int32_t* slot_of,
                          LaunchConfig launch);

// What the grouped GEMM's epilogue does with a row's N outputs.
enum class MoeEpilogue {
  kStore,          // y [rows][N] fp32 (+ bias), or added into y (accumulate)
  kStoreBf16,      // act [rows][N] bf16 (+ bias)
  kSwiglu,         // gate and up interleaved (even columns gate): act [rows][N / 2]
                   // bf16 = silu(gate) * up
  kClampedSwiglu,  // GPT-OSS: gate = min(gate, limit), up = clamp(up, -limit,
                   // limit), act = (up + 1) * gate * sigmoid(1.702 gate)
  kGeluTanh        // as kSwiglu with act = gelu_tanh(gate) * up (Gemma 3's fp8
                   // dense MLP)
};
// Whether e is one of the gated forms (act [rows][N / 2] from interleaved
// gate and up columns), and which (gated_act.h computes it); the gated form
// of GatedForm f.
AGENTKV_MOE_HD inline bool MoeEpilogueGated(MoeEpilogue e) {
  return e == MoeEpilogue::kSwiglu || e == MoeEpilogue::kClampedSwiglu ||
         e == MoeEpilogue::kGeluTanh;
}
AGENTKV_MOE_HD inline GatedForm MoeEpilogueForm(MoeEpilogue e) {
  return e == MoeEpilogue::kClampedSwiglu ? GatedForm::kClampedSwiglu
         : e == MoeEpilogue::kGeluTanh    ? GatedForm::kGeluTanh
                                          : GatedForm::kSwiglu;
}
inline MoeEpilogue MoeGatedEpilogue(GatedForm f) {
  switch (f) {
    case GatedForm::kClampedSwiglu:
      return MoeEpilogue::kClampedSwiglu;
    case GatedForm::kGeluTanh:
      return MoeEpilogue::kGeluTanh;
    default:
      return MoeEpilogue::kSwiglu;
  }
}

// Grouped GEMM: for each group e (an expert), its rows r in [offsets[e],
// offsets[e + 1]) get out[r] = x[src(r)] . w[e]^T (+ bias[e]), w[e] N x K
// in `format` (MoeWeightFormat; bf16: w + e * N * K), bias [E][N] fp32 or
// null; src(r) = order[r] / div where order is given (the token of an
// assignment), else r. Tiles of kMoeTileRows rows come from `tiles`
// (MoePlanTiles); the grid holds max_tiles of them (MoeMaxTiles), the ones
// past tiles[E] exit. With offsets null: one group of `rows` rows, expert
// 0 (a dense layer: the router, fp8 projections). At most 65,535 tiles
// (cudaErrorInvalidValue past that).
// fp32 accumulation, on the kernel `path` names (ChooseMoeGemmPath picks
// it): the CUDA cores' tiles take bf16 weights, the tensor cores' every
// format (quantized rows in whole 16-byte loads; dequantized to bf16 as
// they are staged); the GEMV takes every format (MoeGemvTakes' shapes) and
// streams each expert's weights once per pass of
// MoeGemvPassRows(max_group_rows, format, K) rows (up to 8 for bf16 on the
// CUDA cores, up to 16 for fp8 and mxfp4 on mma.sync), so a decode step
// reads each selected expert once. The path to more speed: the warpgroup
// MMA (fp8 through its e4m3 path) and TMA for the tiles.
struct MoeGemmParams {
  const bf16_t* x = nullptr;  // [*][K]
  const int32_t* order = nullptr;
  int div = 1;
  MoeWeightFormat format = MoeWeightFormat::kBf16;
  const bf16_t* w = nullptr;    // kBf16
  const uint8_t* wq = nullptr;  // kFp8Block: codes [E][N][K]; kMxfp4: blocks [E][N][K / 32][16]
  // kFp8Block: one scale per block of block_rows x block_cols (block_cols a
  // multiple of 16), [E][ceil(N / block_rows)][ceil(K / block_cols)]; with
  // scale_pairs (gate and up rows interleaved, each scaled as its own
  // matrix of N / 2 rows): [E][2][ceil(N / 2 / block_rows)][ceil(K /
  // block_cols)], gate's blocks first, row n's at (n & 1, (n >> 1) /
  // block_rows).
  const float* scales = nullptr;
  int block_rows = 128, block_cols = 128;
  bool scale_pairs = false;
  const uint8_t* exps = nullptr;  // kMxfp4: E8M0 exponents [E][N][K / 32]
  const float* bias = nullptr;
  int N = 0, K = 0;
  const int32_t* offsets = nullptr;
  const int32_t* tiles = nullptr;
  int num_experts = 1;
  int max_tiles = 0;
  int rows = 0;            // offsets null: the one group's rows
  int max_group_rows = 0;  // kGemv: no group has more rows (0: unknown)
  MoeEpilogue epilogue = MoeEpilogue::kStore;
  float limit = 0.f;        // kClampedSwiglu
  float* y = nullptr;       // kStore
  bool accumulate = false;  // kStore: y += the product (a residual stream)
  bf16_t* act = nullptr;    // the gated forms
  MoeGemmPath path = MoeGemmPath::kTensorCores;
};
cudaError_t LaunchMoeGemm(const MoeGemmParams& p, LaunchConfig launch);
// Whether p's epilogue has its output (y for kStore, act otherwise) and
// the gated forms an even N: the launchers' shared check.
inline bool MoeEpilogueOutputsOk(const MoeGemmParams& p) {
  switch (p.epilogue) {
    case MoeEpilogue::kStore:
      return p.y != nullptr;
    case MoeEpilogue::kStoreBf16:
      return p.act != nullptr;
    default:
      return p.act != nullptr && p.N % 2 == 0;
  }
}
// The GEMV form alone (LaunchMoeGemm with path kGemv; moe_gemv.cu).
cudaError_t LaunchMoeGemv(const MoeGemmParams& p, LaunchConfig launch);

// x[t] += sum over j < k of weights[t * k + j] * y[slot_of[t * k + j]]
// (rows of H floats), in slot order.
cudaError_t LaunchMoeCombine(const float* y, const int32_t* slot_of, const float* weights,
                             int tokens, int k, int H, float* x, LaunchConfig launch);

}  // namespace agentkv::backend::cuda::kernels
