// The tensor-parallel kernels (tp.h).
#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/tp.h"
#include "engine/backend/tp_combine.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;

__global__ void EmbedShardKernel(const bf16_t* embed, const int32_t* tokens, const int32_t* picks,
                                 int dim, float scale, int64_t vocab_begin, int64_t vocab_count,
                                 float* x) {
  PdlLaunchDependents();
  PdlWait();
  int32_t tok = tokens[blockIdx.x];
  if (tok < 0) tok = picks[-1 - tok];
  const int64_t local = static_cast<int64_t>(tok) - vocab_begin;
  const bool mine = local >= 0 && local < vocab_count;
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  const bf16_t* er = embed + (mine ? local : 0) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = mine ? Bf(er[i]) * scale : 0.f;
}

__global__ void ArgmaxKeysKernel(const float* logits, int64_t vocab, const int32_t* picks, int rows,
                                 int64_t vocab_begin, uint64_t* keys) {
  PdlLaunchDependents();
  PdlWait();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int32_t p = picks[r];
  keys[r] = tp::ArgmaxKey(logits[r * vocab + p], vocab_begin + p);
}

__global__ void KeysToPicksKernel(const uint64_t* keys, int rows, int32_t* picks) {
  PdlLaunchDependents();
  PdlWait();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) picks[r] = tp::ArgmaxKeyId(keys[r]);
}

// (No PdlLaunchDependents: the dependent launches when this one exits.)
__global__ void StreamFenceKernel() {}

}  // namespace

cudaError_t LaunchEmbedShard(const bf16_t* embed, const int32_t* tokens, const int32_t* picks,
                             int rows, int dim, float scale, int64_t vocab_begin,
                             int64_t vocab_count, float* x, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  return LaunchPdl(EmbedShardKernel, dim3(rows), dim3(256), 0, launch, embed, tokens, picks, dim,
                   scale, vocab_begin, vocab_count, x);
}

cudaError_t LaunchArgmaxKeys(const float* logits, int64_t vocab, const int32_t* picks, int rows,
                             int64_t vocab_begin, uint64_t* keys, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  return LaunchPdl(ArgmaxKeysKernel, dim3((rows + 127) / 128), dim3(128), 0, launch, logits, vocab,
                   picks, rows, vocab_begin, keys);
}

cudaError_t LaunchKeysToPicks(const uint64_t* keys, int rows, int32_t* picks, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  return LaunchPdl(KeysToPicksKernel, dim3((rows + 127) / 128), dim3(128), 0, launch, keys, rows,
                   picks);
}

cudaError_t LaunchStreamFence(cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};  // (no attributes: an ordinary launch)
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, StreamFenceKernel);
}

}  // namespace agentkv::backend::cuda::kernels
