// The decisions of a mixture-of-experts layer on the GPU, as pure functions
// of host and device (compiled by nvcc for the kernels of moe.cu, by the host
// compiler for tests that need no GPU and no CUDA toolkit):
// - which experts each token takes and with what weights (MoeRouteToken:
//   the CPU reference's kernels::RouteTopK, same ties);
// - the assignments (token, slot) grouped by expert (a counting sort,
//   tokens ascending within an expert, as the CPU backend orders them), the
//   slot each assignment's expert output lands in, and the row tiles of a
//   grouped GEMM over those groups (MoePlan*).
// The MoE kernels run exactly these functions, so the host tests pin the
// arithmetic the device does.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define AGENTKV_MOE_HD __host__ __device__
#else
#define AGENTKV_MOE_HD
#endif

namespace agentkv::backend::cuda::kernels {

// Largest expert count and experts per token the kernels take (a block's
// threads cover the experts; a token's choices sit in registers).
inline constexpr int kMaxMoeExperts = 1024;
inline constexpr int kMaxMoeTopK = 32;

// Token routing from its `num_experts` router logits: the k experts with the
// largest values (among equal values the lower id first) into `experts`,
// highest first, and their weights:
//   softmax_first false (GPT-OSS): softmax over the k chosen logits;
//   softmax_first true (Qwen3-MoE): softmax over all logits, the k chosen
//   probabilities, divided by their sum when `renormalize`.
// Selection runs on the logits (the softmax is monotonic): the chosen set
// differs from selecting on the probabilities only where two distinct
// logits round to one probability. NaN logits are never chosen; k <=
// num_experts and k <= kMaxMoeTopK.
AGENTKV_MOE_HD inline void MoeRouteToken(const float* logits, int num_experts, int k,
                                         bool softmax_first, bool renormalize, int32_t* experts,
                                         float* weights) {
  // k passes, each taking the best (value, id) below the previous pick in
  // the order "value descending, id ascending": no set of taken ids needed.
  float prev_v = INFINITY;
  int prev_e = -1;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bv = -INFINITY;
    for (int e = 0; e < num_experts; ++e) {
      const float v = logits[e];
      if (!(v == v)) continue;                                     // NaN
      if (!(v < prev_v || (v == prev_v && e > prev_e))) continue;  // taken
      if (best < 0 || v > bv) {
        best = e;
        bv = v;
      }
    }
    if (best < 0) {  // fewer usable logits than k: the rest weigh nothing
      experts[j] = prev_e < 0 ? 0 : prev_e;
      weights[j] = -INFINITY;
    } else {
      experts[j] = best;
      weights[j] = bv;
      prev_v = bv;
      prev_e = best;
    }
  }
  float mx = weights[0];  // the largest logit (taken first)
  if (softmax_first) {
    float sum = 0.f;
    for (int e = 0; e < num_experts; ++e)
      if (logits[e] == logits[e]) sum += expf(logits[e] - mx);
    for (int j = 0; j < k; ++j) weights[j] = sum > 0.f ? expf(weights[j] - mx) / sum : 0.f;
    if (renormalize) {
      float s = 0.f;
      for (int j = 0; j < k; ++j) s += weights[j];
      for (int j = 0; j < k; ++j) weights[j] = s > 0.f ? weights[j] / s : 0.f;
    }
    return;
  }
  float sum = 0.f;
  for (int j = 0; j < k; ++j) sum += weights[j] = expf(weights[j] - mx);
  for (int j = 0; j < k; ++j) weights[j] = sum > 0.f ? weights[j] / sum : 0.f;
}

// Rows of a grouped-GEMM tile (MoePlanTiles, LaunchMoeGemm): every tile
// streams its expert's weights once, so prefill wants tall tiles; a
// decode step's tile of one row or a few costs the tensor cores nothing
// extra.
inline constexpr int kMoeTileRows = 64;

// offsets[e] .. offsets[e + 1]: expert e's assignments once grouped
// (offsets has num_experts + 1 entries), from the `assignments` expert ids
// (token t's slot j at t * k + j). Ids outside [0, num_experts) are counted
// nowhere (the kernels never produce them).
AGENTKV_MOE_HD inline void MoePlanOffsets(const int32_t* experts, int assignments, int num_experts,
                                          int32_t* offsets) {
  for (int e = 0; e <= num_experts; ++e) offsets[e] = 0;
  for (int a = 0; a < assignments; ++a) {
    const int e = experts[a];
    if (e >= 0 && e < num_experts) ++offsets[e + 1];
  }
  for (int e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
}

// Expert e's group: order[offsets[e] + i] is its i-th assignment (token
// ascending), and slot_of[a] the row of assignment a in the grouped rows.
AGENTKV_MOE_HD inline void MoePlanExpert(int e, const int32_t* experts, int assignments,
                                         const int32_t* offsets, int32_t* order, int32_t* slot_of) {
  int32_t at = offsets[e];
  for (int a = 0; a < assignments; ++a)
    if (experts[a] == e) {
      order[at] = a;
      slot_of[a] = at;
      ++at;
    }
}

// The grouped GEMM's row tiles: tiles[e] .. tiles[e + 1] are expert e's
// (ceil(rows / kMoeTileRows) each); tiles has num_experts + 1 entries.
AGENTKV_MOE_HD inline void MoePlanTiles(const int32_t* offsets, int num_experts, int32_t* tiles) {
  tiles[0] = 0;
  for (int e = 0; e < num_experts; ++e)
    tiles[e + 1] = tiles[e] + (offsets[e + 1] - offsets[e] + kMoeTileRows - 1) / kMoeTileRows;
}

// At most this many tiles for `assignments` rows in `num_experts` groups:
// the grouped GEMM's grid (blocks past tiles[num_experts] exit).
AGENTKV_MOE_HD inline int MoeMaxTiles(int assignments, int num_experts) {
  const int e = assignments < num_experts ? assignments : num_experts;
  return (assignments + kMoeTileRows - 1) / kMoeTileRows + e;
}

// Which expert tile `b` belongs to (binary search over tiles), or -1 past
// the last; *row0 is its first grouped row.
AGENTKV_MOE_HD inline int MoeTileExpert(int b, const int32_t* tiles, const int32_t* offsets,
                                        int num_experts, int* row0) {
  if (b < 0 || b >= tiles[num_experts]) return -1;
  int lo = 0, hi = num_experts - 1;  // the last e with tiles[e] <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tiles[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  // Experts with no tiles share tiles[e] with the next: skip to the one
  // that owns b.
  while (tiles[lo + 1] <= b) ++lo;
  *row0 = offsets[lo] + (b - tiles[lo]) * kMoeTileRows;
  return lo;
}

// How a grouped GEMM's expert weights are stored (LaunchMoeGemm):
//   kBf16: w [E][N][K] bf16.
//   kFp8Block: e4m3 codes [E][N][K] with one fp32 scale per block of
//     block_rows x block_cols (W = code * scale), as FP8 block checkpoints
//     store them.
//   kMxfp4: [E][N][K / 32][16] bytes of e2m1 pairs (low nibble first) and
//     an E8M0 exponent [E][N][K / 32] per 32 values, as MXFP4 checkpoints.
enum class MoeWeightFormat { kBf16, kFp8Block, kMxfp4 };

// Weight elements in one 16-byte load (a lane's unit of the GEMV).
AGENTKV_MOE_HD inline constexpr int MoeWeightVecElems(MoeWeightFormat f) {
  return f == MoeWeightFormat::kBf16 ? 8 : f == MoeWeightFormat::kFp8Block ? 16 : 32;
}

// Which kernel runs a grouped GEMM:
//   kTensorCores: row tiles of kMoeTileRows on WMMA (prefill; quantized
//     weights dequantized to bf16 as they are staged);
//   kCudaCores: the same tiles on the CUDA cores (the plain form tests
//     compare against);
//   kGemv: weight streaming at near the memory bandwidth, each warp a pair
//     of weight rows of one expert against up to kMaxMoeGemvRows rows of
//     the group at a time (decode steps: groups of a few rows), quantized
//     weights dequantized in registers;
//   kUnsupported: no kernel takes the shape.
enum class MoeGemmPath { kTensorCores, kCudaCores, kGemv, kUnsupported };

// The GEMV's rows per pass (a register each, per weight row); a pass's
// rows of K bf16 sit in at most kMoeGemvXBytes of shared memory, so K up
// to kMaxMoeGemvK at every pass size (more with fewer rows per pass).
inline constexpr int kMaxMoeGemvRows = 8;
inline constexpr int kMoeGemvXBytes = 96 * 1024;
inline constexpr int kMaxMoeGemvK = kMoeGemvXBytes / (2 * kMaxMoeGemvRows);
// The GEMV serves steps of at most this many tokens (a token takes an
// expert once, so no group has more rows). Larger steps go to the tensor
// cores even where their groups are small: at 64 decoding tokens (about 4
// rows per expert on Qwen3-30B-A3B) the tiles measured 1.2x (bf16), 1.4x
// (FP8) and 1.7x (MXFP4) the GEMV's throughput on an H200, whose CUDA-core
// arithmetic over 8-row passes is compute-bound there; at 1 token the GEMV
// measured 1.6x to 5x the tiles.
inline constexpr int kMoeGemvTokens = 16;

// The GEMV's rows per pass for groups of at most max_group_rows rows (0:
// unknown): the power of two that holds them, at most kMaxMoeGemvRows.
AGENTKV_MOE_HD inline int MoeGemvPassRows(int max_group_rows) {
  if (max_group_rows <= 0) return kMaxMoeGemvRows;
  int r = 1;
  while (r < max_group_rows && r < kMaxMoeGemvRows) r *= 2;
  return r;
}

// Whether the GEMV takes N x K weights of format f for groups of at most
// max_group_rows rows (0: unknown).
AGENTKV_MOE_HD inline bool MoeGemvTakes(int N, int K, MoeWeightFormat f, int max_group_rows = 0) {
  return N > 0 && K > 0 && K % MoeWeightVecElems(f) == 0 &&
         static_cast<int64_t>(K) * 2 * MoeGemvPassRows(max_group_rows) <= kMoeGemvXBytes;
}

// The kernel for a step of `tokens` tokens, k experts each, over
// num_experts experts of N x K weights of format f (see MoeGemmPath): the
// GEMV for decode-sized groups where it takes the shape, the tensor cores
// otherwise (quantized weights there need whole 16-byte loads per row).
// gemv false (CudaTuning::moe_gemv off): the tensor cores wherever they
// take the shape.
AGENTKV_MOE_HD inline MoeGemmPath ChooseMoeGemmPath(int tokens, int k, int num_experts, int N,
                                                    int K, MoeWeightFormat f, bool gemv = true) {
  if (tokens <= 0 || k <= 0 || num_experts <= 0 || N <= 0 || K <= 0)
    return MoeGemmPath::kUnsupported;
  const MoeGemmPath tiles = f == MoeWeightFormat::kBf16 || K % MoeWeightVecElems(f) == 0
                                ? MoeGemmPath::kTensorCores
                                : MoeGemmPath::kUnsupported;
  if (!MoeGemvTakes(N, K, f, tokens)) return tiles;
  if (!gemv && tiles != MoeGemmPath::kUnsupported) return tiles;
  return tokens <= kMoeGemvTokens || tiles == MoeGemmPath::kUnsupported ? MoeGemmPath::kGemv
                                                                        : tiles;
}

}  // namespace agentkv::backend::cuda::kernels
