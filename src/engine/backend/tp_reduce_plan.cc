#include "engine/backend/tp_reduce_plan.h"

#include <algorithm>

namespace agentkv::backend {
namespace {

size_t AlignWindow(size_t n) { return (n + kTpWindowAlign - 1) / kTpWindowAlign * kTpWindowAlign; }

}  // namespace

TpReduceArena TpReduceArenaFor(const model::ModelConfig& c, int64_t tokens) {
  TpReduceArena a;
  a.residual_bytes = static_cast<size_t>(std::max<int64_t>(tokens, 1)) * c.hidden_size * 4;
  a.bytes = AlignWindow(a.residual_bytes);
  if (c.sandwich_norm) {
    a.attn_out = a.bytes;
    a.bytes += AlignWindow(a.residual_bytes);
  }
  return a;
}

TpReducePlacement PlaceTpReduce(const model::ModelConfig& c, int64_t tokens, size_t window_bytes) {
  const TpReduceArena a = TpReduceArenaFor(c, tokens);
  TpReducePlacement p;
  p.buffer_bytes = a.residual_bytes;
  if (window_bytes == 0 || a.bytes > window_bytes) return p;
  p.x_in_window = true;
  p.x_offset = 0;
  if (c.sandwich_norm) {
    p.o_in_window = true;
    p.o_offset = a.attn_out;
  }
  return p;
}

bool TpWindowReduceNeedsFence(int nccl_version, int compute_major) {
  return compute_major >= 9 && nccl_version >= kNcclSymmetricWaitDropped &&
         nccl_version < kNcclSymmetricWaitRestored;
}

}  // namespace agentkv::backend
