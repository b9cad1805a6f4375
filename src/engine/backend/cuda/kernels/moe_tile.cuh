// The tile of grouped rows one block of the MoE GEMV kernels works on, read
// from the plan kernel's grouping (moe_plan.h) where there are experts.
#pragma once

#include <cstdint>

#include "engine/backend/cuda/kernels/moe.h"
#include "engine/backend/cuda/kernels/moe_plan.h"

namespace agentkv::backend::cuda::kernels {

// Expert e's rows row0 .. row0 + rows of the grouped input.
struct MoeTile {
  int e, row0, rows;
};

// Block b's tile. With E == 0 (one group, no plan) the b-th run of
// kMoeTileRows rows. Otherwise the grouping's tiles and offsets (E + 1
// entries each) are staged in tiles_s / offsets_s and searched there
// (MoeTileExpert): one round of global loads for the whole block.
// Returns false when the block has no tile; every thread of the block gets
// the same answer, so the whole block may return. Every thread of the block
// must call it (it synchronises when E > 0), after the plan kernel's output
// is visible (PdlWait) when E > 0.
__device__ __forceinline__ bool FindMoeTile(const MoeGemmParams& p, int E, int b, int32_t* tiles_s,
                                            int32_t* offsets_s, MoeTile* t) {
  if (E == 0) {
    t->e = 0;
    t->row0 = b * kMoeTileRows;
    if (t->row0 >= p.rows) return false;
    t->rows = min(kMoeTileRows, p.rows - t->row0);
    return true;
  }
  for (int i = threadIdx.x; i <= E; i += blockDim.x) {
    tiles_s[i] = p.tiles[i];
    offsets_s[i] = p.offsets[i];
  }
  __syncthreads();
  t->e = MoeTileExpert(b, tiles_s, offsets_s, E, &t->row0);
  if (t->e < 0) return false;
  t->rows = min(kMoeTileRows, offsets_s[t->e + 1] - t->row0);
  return true;
}

}  // namespace agentkv::backend::cuda::kernels
