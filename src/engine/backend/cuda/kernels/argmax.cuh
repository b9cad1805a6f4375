// The one comparison every argmax kernel makes (the two-pass LaunchArgmax
// and the LM head's warpgroup GEMM epilogue), so that they pick the same
// index from the same values.
#pragma once

namespace agentkv::backend::cuda::kernels {

// (v, i) replaces (bv, bi) if it is better: NaN never wins (comparisons are
// false); lowest index on ties. The best of a set is independent of the
// order in which its members are offered.
__device__ __forceinline__ void Better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

}  // namespace agentkv::backend::cuda::kernels
