// How the quantized GEMV (moe_gemv_mma.cu) lays mxfp4 weights and the
// staged activations into mma.sync m16n8k16 fragments, as pure functions of
// host and device (compiled by nvcc for the kernel, by the host compiler
// for tests that need no GPU), so that host tests pin the arithmetic.
//
// After the kernel's word transpose, lane t of a row holds one 32-bit word
// of each 32-value block: values 8t .. 8t + 7 of the block, one e2m1 nibble
// each, low nibble first. Step s (0, 1) of the block takes values
// 8t + 4s .. 8t + 4s + 3 into the lane's A k slots 2t, 2t + 1, 2t + 8,
// 2t + 9 in the order (+0, +2, +1, +3) (MoeMxfp4SlotValue): two e4m3
// pairs (MoeMxfp4StepPairs) that cvt.rn.f16x2.e4m3x2 turns into f16
// pairs. The B fragment of the step is 4 consecutive staged values, so x
// is staged with each value at MoeMxfp4StagePos.
#pragma once

#include <cstdint>

#include "engine/backend/cuda/kernels/moe_plan.h"

namespace agentkv::backend::cuda::kernels {

// The nibbles of u (value i in bits 4i .. 4i + 3) as e4m3 bytes of the
// e2m1 value times 2^-6: sign to bit 7, exponent and mantissa to bits
// 4..2 (exact for every e2m1 code, the subnormal 0.5 included). Even:
// byte j is nibble 2j's; odd: nibble 2j + 1's.
AGENTKV_MOE_HD inline uint32_t MoeE2m1EvenAsE4m3(uint32_t u) {
  return ((u << 4) & 0x80808080u) | ((u << 2) & 0x1c1c1c1cu);
}
AGENTKV_MOE_HD inline uint32_t MoeE2m1OddAsE4m3(uint32_t u) {
  return (u & 0x80808080u) | ((u >> 2) & 0x1c1c1c1cu);
}

// Step s's e4m3 pairs of word u: pair[0] for k slots (2t, 2t + 1), pair[1]
// for (2t + 8, 2t + 9), each a 16-bit value (the first slot's byte low).
AGENTKV_MOE_HD inline void MoeMxfp4StepPairs(uint32_t u, int s, uint32_t (&pair)[2]) {
  pair[0] = (MoeE2m1EvenAsE4m3(u) >> (16 * s)) & 0xffffu;
  pair[1] = (MoeE2m1OddAsE4m3(u) >> (16 * s)) & 0xffffu;
}

// The value (within its 32-value block) in k slot j (0: 2t, 1: 2t + 1,
// 2: 2t + 8, 3: 2t + 9) of lane t's A fragment at step s.
AGENTKV_MOE_HD inline int MoeMxfp4SlotValue(int t, int s, int j) {
  return 8 * t + 4 * s + (j == 1 ? 2 : j == 2 ? 1 : j);
}

// Where value k of an x row sits in its staged row: within its 32-value
// block, value 8t + 4s + j at 16s + 4t + (j with 1 and 2 swapped), so that
// lane t's B fragment of step s is the 4 values from 16s + 4t.
AGENTKV_MOE_HD inline int MoeMxfp4StagePos(int k) {
  const int v = k & 31, j = v & 3;
  return (k & ~31) + 16 * ((v >> 2) & 1) + 4 * (v >> 3) + (j == 1 ? 2 : j == 2 ? 1 : j);
}

}  // namespace agentkv::backend::cuda::kernels
