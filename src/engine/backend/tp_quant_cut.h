// TpCutQuantized: a rank's cut of a weight stored quantized (tensor
// parallelism, docs/tensor-parallel.md "Quantized checkpoints"), with its
// scales cut to match, so that the rank's weight dequantizes to exactly
// the values of the full weight's slice (no value is requantized).
//
// The cut is TpPlan::QuantCutOf's: rows of the logical [.., out, in]
// weight (column-parallel q/k/v, gate/up, experts' gate_up) or its
// columns (row-parallel o, down), in `parts` equal blocks of the cut
// dimension (fused tensors). Per format:
// - fp8 block (weight_scale_inv per block_rows x block_cols tile): the
//   scale grid is cut with the weight. Where the slice starts or ends
//   inside a tile (e.g. 192 rows a rank under 128-row tiles), the rank
//   keeps a refined grid instead: tiles of TpCutBlock rows (or columns),
//   a divisor of the original edge, each carrying the scale of the one
//   full tile it lies in. The tile straddling two ranks is thus shared:
//   each holds its part with the same scale. Costs more scale entries,
//   changes no value.
// - fp8 per channel: rows take their scales; a column cut keeps them all.
// - fp8 per tensor: unchanged.
// - MXFP4 (one E8M0 scale per 32 inputs): rows take their blocks; a column
//   cut must be whole blocks (begin and size multiples of 32), else
//   refused: a rank holding part of a block would need the kernels to
//   read from inside it. TpPlan instead gives such ranks the whole blocks
//   around their slice, with TensorCut's padding (indices past the
//   tensor: zero rows, zero columns) and keep range (the columns another
//   rank owns: zero nibbles, the block's scale kept). fp8 cuts never pad.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "engine/backend/tp_plan.h"
#include "engine/model/quant_format.h"
#include "util/status.h"

namespace agentkv::backend {

// The block edge a cut leaves of a scale grid of `block` along a
// dimension of `n`, cut to [begin, begin + size) of each of `parts` equal
// blocks: the largest divisor of `block` that also divides begin, size
// and (parts > 1) n / parts, so that every block of the cut lies inside
// one block of the full grid. `block` itself when the cut is on the grid.
// Requires block > 0; with parts <= 1, n is not read.
int64_t TpCutBlock(int64_t block, int64_t begin, int64_t size, int64_t n, int parts);

// The cut of `full` (a valid weight) by `cut`, in its logical [.., out,
// in] dimensions. kWhole: a copy. Errors (InvalidArgument, naming
// `name`): kZero (no quantized weight is a bias), a cut of a dimension
// other than the last two, a slice out of range (past the end: fp8 only),
// an MXFP4 column cut that is not whole 32-value blocks, padding or a keep
// range on an fp8 weight.
Result<model::QuantizedWeight> TpCutQuantized(const model::QuantizedWeight& full,
                                              const TensorCut& cut, const std::string& name);

}  // namespace agentkv::backend
