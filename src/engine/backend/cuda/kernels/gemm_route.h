// Which shapes each matrix-product kernel takes, and how the warpgroup GEMM
// splits K: plain arithmetic on the shapes, shared by the launchers (which
// refuse what they do not take: gemv.cu, wgmma_gemm.cu, wgmma_prompt_gemm.cu,
// norm.cu) and by the backend's GEMM plan (cuda/gemm_plan.h), which is
// tested without a GPU. No CUDA headers; pure functions.
#pragma once

namespace agentkv::backend::cuda::kernels {

// The weight-streaming GEMV (gemv.cu): decode steps of at most this many
// rows, k a multiple of 8 and m * k bf16 within 32 KiB (x is staged in
// shared memory).
inline constexpr int kMaxGemvRows = 8;
inline bool GemvSupported(int m, int k) {
  return m >= 1 && m <= kMaxGemvRows && k % 8 == 0 && static_cast<long long>(m) * k * 2 <= 32768;
}

// The GEMV with the RMSNorm before it: x is held in registers, so k at most
// kMaxNormGemvK (four float4s per thread of eight warps) and one or two rows.
inline constexpr int kMaxNormGemvRows = 2;
inline constexpr int kMaxNormGemvK = 4096;
inline bool NormGemvSupported(int m, int k) {
  return m <= kMaxNormGemvRows && k <= kMaxNormGemvK && GemvSupported(m, k);
}

// The gate_up GEMV with the gated activation in its epilogue (n even: gate
// and up rows interleaved), alone or with the norm before it.
inline constexpr int kMaxGemvActRows = 2;
inline bool GemvGatedActSupported(int m, int n, int k) {
  return m <= kMaxGemvActRows && n % 2 == 0 && GemvSupported(m, k);
}
inline bool NormGemvGatedActSupported(int m, int n, int k) {
  return m <= kMaxNormGemvRows && n % 2 == 0 && NormGemvSupported(m, k);
}

// The warpgroup GEMM (wgmma_gemm.cu): up to kMaxWgmmaRows rows, n a multiple
// of 64, k of kWgmmaAtomK (one 128-byte swizzled row of bf16).
inline constexpr int kMaxWgmmaRows = 64;
inline constexpr int kMaxWgmmaSplits = 16;
inline constexpr int kWgmmaAtomK = 64;
inline bool WgmmaGemmSupported(int m, int n, int k) {
  return m >= 1 && m <= kMaxWgmmaRows && n >= 64 && n % 64 == 0 && k >= kWgmmaAtomK &&
         k % kWgmmaAtomK == 0;
}

struct WgmmaGemmPlan {
  int tile = 0;  // features per block, 64 or 128; 0: WgmmaGemmPlanFor's
  int splits = 1;
  bool k128 = false;  // stages of 128 k (k a multiple of 128)
};
// Tiles of 64 features; K split while the blocks stay within two per SM
// (96 KiB of shared memory each) and each split keeps two stages; stages of
// 128 k where K allows (2-10% faster than 64 in the benchmark). Measured at
// 64 rows, the most splits that fit were the fastest for the o (8), QKV (4)
// and down (8) projections (bench/RESULTS.md item 44).
inline WgmmaGemmPlan WgmmaGemmPlanFor(int n, int k, int num_sms) {
  WgmmaGemmPlan p;
  p.tile = 64;
  p.k128 = k % 128 == 0;
  const int tiles = n / p.tile, stages = k / (p.k128 ? 128 : 64);
  while (p.splits * 2 <= kMaxWgmmaSplits && tiles * p.splits * 2 <= 2 * num_sms &&
         stages / (p.splits * 2) >= 2)
    p.splits *= 2;
  return p;
}

// The kernel that adds a split-K GEMM's planes into the residual stream and
// normalises it (norm.cu): dim a multiple of 4, at most kMaxWgmmaSplits planes.
inline bool AddPartsRmsNormSupported(int dim, int nparts) {
  return dim % 4 == 0 && nparts >= 1 && nparts <= kMaxWgmmaSplits;
}

// The persistent prompt GEMM (wgmma_prompt_gemm.cu): 128 x 256 tiles, n a
// multiple of 256, k of 64; on a device PromptGemmDeviceSupported() accepts.
inline constexpr int kPromptGemmTileN = 256;
inline constexpr int kPromptGemmTileK = 64;
inline bool PromptGemmShapeSupported(int m, int n, int k) {
  return m >= 1 && n >= kPromptGemmTileN && n % kPromptGemmTileN == 0 && k >= kPromptGemmTileK &&
         k % kPromptGemmTileK == 0;
}

}  // namespace agentkv::backend::cuda::kernels
