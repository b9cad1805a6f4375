// SampleDraw: the truncated-sampling draw shared by the CPU Sampler and the
// backends that sample on the device (which rows a backend may pick itself
// is ChoosePickMode's decision, engine/pick_mode.h).
//
// The distribution (as Hugging Face and vLLM order it):
//   1. The argmax: lowest id of the largest logit m, NaN never wins, id 0 if
//      none beats -inf. If m is not finite (all -inf or NaN, or some +inf)
//      it is the pick.
//   2. w_i = expf((l_i - m) * (1 / T)) in float (NaN -> 0); the best token's
//      weight is exactly 1. Tokens are ordered by (w desc, id asc).
//   3. top_k (0 < k < vocab): the first k tokens in that order are kept.
//   4. top_p (< 1): of the tokens kept so far, the shortest prefix (in that
//      order) whose weights sum to at least top_p times their total.
//   5. min_p: tokens with w < min_p (relative to the best, whose w is 1)
//      and tokens with w == 0 are dropped.
//   6. The draw, an inverse CDF over the kept tokens in id order: with M the
//      kept weights' sum (double), the first kept id whose running sum
//      exceeds u * M. If rounding leaves no such id, the last kept id; if
//      nothing is kept (possible only when 1 / T overflows), the argmax.
// The CUDA kernel (engine/backend/cuda/kernels/sample_kernel.cu) computes the same kept set
// without sorting; its float exp and summation order may differ from the
// CPU's by rounding, so the two pick the same token except where u * M (or
// top_p's target, or a weight against min_p) lies within rounding of a
// boundary.
//
// A sampled row draws its u whatever the logits (also where the argmax is
// the pick), so that the draws of a seeded sequence do not depend on them.
//
// Thread-safety: SampleDraw keeps per-thread scratch; any thread may call it.
#pragma once

#include <cstdint>
#include <span>

#include "engine/backend/row_pick.h"

namespace agentkv::backend {

// The draw defined above on one row of logits (vocabulary long, not empty),
// used as scratch and left clobbered. Allocates nothing after a thread's
// first call for a vocabulary size.
int32_t SampleDraw(std::span<float> logits, const SampleSettings& s);

// The distribution SampleDraw draws from, in place: leaves logits[i] = token
// i's kept weight (steps 2 to 5 above; 0 for tokens not kept) and returns
// -1, or returns the token SampleDraw picks whatever u is (a non-finite
// largest logit, or nothing kept), with the row then unspecified. s.u is
// not read. SampleDraw = SampleWeights, then DrawFromWeights with s.u.
int32_t SampleWeights(std::span<float> logits, const SampleSettings& s);
// Step 6 above over weights (> 0: kept), with u in [0, 1); -1 when no
// weight is positive.
int32_t DrawFromWeights(std::span<const float> weights, double u);

}  // namespace agentkv::backend
