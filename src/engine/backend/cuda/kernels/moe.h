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
//   LaunchMoeCombine                        -> x [T][H] += sum_j w_j y
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backend/cuda/kernels/launch.h"
#include "engine/backend/cuda/kernels/moe_plan.h"

namespace agentkv::cuda {

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
  kStore,         // y [rows][N] fp32 (+ bias)
  kSwiglu,        // gate and up interleaved (even columns gate): act [rows][N / 2]
                  // bf16 = silu(gate) * up
  kClampedSwiglu  // GPT-OSS: gate = min(gate, limit), up = clamp(up, -limit,
                  // limit), act = (up + 1) * gate * sigmoid(1.702 gate)
};

// Grouped GEMM: for each group e (an expert), its rows r in [offsets[e],
// offsets[e + 1]) get out[r] = x[src(r)] . w[e]^T (+ bias[e]), w[e] [N][K]
// bf16 (w + e * N * K), bias [E][N] fp32 or null; src(r) = order[r] / div
// where order is given (the token of an assignment), else r. Tiles of
// kMoeTileRows rows come from `tiles` (MoePlanTiles); the grid holds
// max_tiles of them (MoeMaxTiles), the ones past tiles[E] exit.
// With offsets null: one group of `rows` rows, expert 0 (the router). At
// most 65,535 tiles (cudaErrorInvalidValue past that).
// fp32 accumulation; tiles on the tensor cores (WMMA), or with
// tensor_cores false on the CUDA cores (the plain form the tests compare
// against). Each tile streams its expert's weight columns once, so a decode
// step is one weight-streaming pass per selected expert. The path to speed:
// pipelined (cp.async / TMA) stages, wider row tiles for prefill, the
// warpgroup MMA.
struct MoeGemmParams {
  const bf16_t* x = nullptr;  // [*][K]
  const int32_t* order = nullptr;
  int div = 1;
  const bf16_t* w = nullptr;
  const float* bias = nullptr;
  int N = 0, K = 0;
  const int32_t* offsets = nullptr;
  const int32_t* tiles = nullptr;
  int num_experts = 1;
  int max_tiles = 0;
  int rows = 0;  // offsets null: the one group's rows
  MoeEpilogue epilogue = MoeEpilogue::kStore;
  float limit = 0.f;      // kClampedSwiglu
  float* y = nullptr;     // kStore
  bf16_t* act = nullptr;  // the gated forms
  bool tensor_cores = true;
};
cudaError_t LaunchMoeGemm(const MoeGemmParams& p, LaunchConfig launch);

// x[t] += sum over j < k of weights[t * k + j] * y[slot_of[t * k + j]]
// (rows of H floats), in slot order.
cudaError_t LaunchMoeCombine(const float* y, const int32_t* slot_of, const float* weights,
                             int tokens, int k, int H, float* x, LaunchConfig launch);

}  // namespace agentkv::cuda
