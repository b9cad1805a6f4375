#include "engine/backend/tp_reduce_plan.h"

#include <algorithm>

namespace agentkv::backend {
namespace {

size_t AlignWindow(size_t n) { return (n + kTpWindowAlign - 1) / kTpWindowAlign * kTpWindowAlign; }

}  // namespace

bool TpReduceFromWindow(size_t bytes) { return bytes > 0 && bytes <= kTpWindowReduceMaxBytes; }

int64_t TpWindowTokens(const model::ModelConfig& c) {
  const size_t row = static_cast<size_t>(std::max(c.hidden_size, 1)) * 4;
  return static_cast<int64_t>(kTpWindowReduceMaxBytes / row);
}

bool TpStepFromWindow(const model::ModelConfig& c, int64_t tokens, int64_t window_rows) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(tokens, 0)) * c.hidden_size * 4;
  return tokens > 0 && tokens <= window_rows && TpReduceFromWindow(bytes);
}

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
