// CudaBackend as one rank of a tensor-parallel model: the steps' pieces
// that differ from the single-GPU path (CudaBackendOptions::tp_comm;
// docs/tensor-parallel.md).
#include "engine/backend/cuda/backend.h"
#include "engine/backend/cuda/kernels/tp.h"

namespace agentkv::backend::cuda {

Status CudaBackend::TpEmbed(const int32_t* tokens, const int32_t* prev_picks, int T) {
  const model::ModelConfig& c = config_;
  float* x = x_.get<float>();
  CUDA_RETURN_IF_ERROR(kernels::LaunchEmbedShard(embed_, tokens, prev_picks, T, c.hidden_size,
                                                 c.embed_scale, options_.tp_vocab_begin,
                                                 c.vocab_size, x, launch_));
  return TpReduce(x, T);
}

Status CudaBackend::TpReduce(float* buf, int T) {
  // From a window, on an NCCL whose symmetric kernels start as programmatic
  // dependents of the kernel before them without waiting for it (and every
  // kernel here lets its dependents start early): a fence between, or the
  // sum reads buf before it is written (TpWindowReduceNeedsFence).
  const bool in_window =
      (x_.in_window() && buf == x_.get<float>()) || (o_.in_window() && buf == o_.get<float>());
  if (reduce_fence_ && in_window) CUDA_RETURN_IF_ERROR(kernels::LaunchStreamFence(stream_));
  // fp32: the residual stream's precision (a bf16 sum would round the
  // residual at every layer, which the single-GPU path never does).
  return options_.tp_comm.SumF32(buf, static_cast<size_t>(T) * config_.hidden_size, stream_);
}

Status CudaBackend::TpCombinePicks(const float* logits, int rows, int32_t* picks) {
  uint64_t* keys = tp_keys_.get<uint64_t>();
  CUDA_RETURN_IF_ERROR(kernels::LaunchArgmaxKeys(logits, config_.vocab_size, picks, rows,
                                                 options_.tp_vocab_begin, keys, launch_));
  RETURN_IF_ERROR(options_.tp_comm.MaxU64(keys, rows, stream_));
  CUDA_RETURN_IF_ERROR(kernels::LaunchKeysToPicks(keys, rows, picks, launch_));
  return Status::Ok();
}

}  // namespace agentkv::backend::cuda
