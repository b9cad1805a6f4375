// The embedding and RMSNorm kernels (norm.h).
#include <cuda_bf16.h>

#include <algorithm>

#include "engine/backend/cuda/kernels/block_reduce.cuh"
#include "engine/backend/cuda/kernels/norm.h"
#include "engine/backend/cuda/kernels/pdl.cuh"
#include "engine/backend/cuda/kernels/wgmma_gemm.h"

namespace agentkv::backend::cuda::kernels {
namespace {

using namespace agentkv::backend::cuda::kernels::reduce;

__global__ void EmbedKernel(const bf16_t* embed, const int32_t* tokens, const int32_t* picks,
                            int dim, float scale, float* x, bool vec) {
  PdlLaunchDependents();
  PdlWait();
  int32_t tok = tokens[blockIdx.x];
  if (tok < 0) tok = picks[-1 - tok];
  const int64_t row = static_cast<int64_t>(tok) * dim;
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  if (vec) {
    // 8 elements a thread: a row of 2,048 in one load each (the 2-byte
    // loads of the loop below went out one after another: ~5 us, the decode
    // step's first kernel).
    const uint4* er = reinterpret_cast<const uint4*>(embed + row);
    float4* xv = reinterpret_cast<float4*>(xr);
    for (int i = threadIdx.x; i < dim / 8; i += blockDim.x) {
      const uint4 v = er[i];
      const bf16_t* e = reinterpret_cast<const bf16_t*>(&v);
      float f[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = Bf(e[j]) * scale;
      xv[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
      xv[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    return;
  }
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = Bf(embed[row + i]) * scale;
}

__global__ void RmsNormKernel(const float* x, const int32_t* rows_idx, const float* w, bf16_t* out,
                              int dim, float eps, bool plus_one) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ float red[32];
  const int64_t src = rows_idx ? rows_idx[blockIdx.x] : blockIdx.x;
  const float* xr = x + src * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  bf16_t* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = plus_one ? 1.0f + w[i] : w[i];
    o[i] = ToBf(xr[i] * inv * g);
  }
}

// RmsNormKernel for dim a multiple of 4 and at most kNormVec * 4 per
// thread: float4 loads, the row kept in registers between the sum and the
// scaling (one read of x instead of two), 8-byte bf16 stores.
constexpr int kNormVec = 4;
__global__ void RmsNormVecKernel(const float* x, const int32_t* rows_idx, const float* w,
                                 bf16_t* out, int dim, float eps, bool plus_one) {
  // Norm weights before the wait (no kernel writes them): one round trip
  // less after it.
  const int nv = dim / 4;
  const float4* wv = reinterpret_cast<const float4*>(w);
  float4 g[kNormVec];
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    g[j] = i < nv ? __ldg(wv + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (plus_one) g[j] = make_float4(1.f + g[j].x, 1.f + g[j].y, 1.f + g[j].z, 1.f + g[j].w);
  }
  PdlLaunchDependents();
  PdlWait();
  __shared__ float red[32];
  const int64_t src = rows_idx ? rows_idx[blockIdx.x] : blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + src * dim);
  float4 v[kNormVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    v[j] = i < nv ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  uint2* o = reinterpret_cast<uint2*>(out + static_cast<int64_t>(blockIdx.x) * dim);
#pragma unroll
  for (int j = 0; j < kNormVec; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= nv) break;
    const uint32_t lo = static_cast<uint32_t>(ToBf(v[j].x * inv * g[j].x)) |
                        static_cast<uint32_t>(ToBf(v[j].y * inv * g[j].y)) << 16;
    const uint32_t hi = static_cast<uint32_t>(ToBf(v[j].z * inv * g[j].z)) |
                        static_cast<uint32_t>(ToBf(v[j].w * inv * g[j].w)) << 16;
    o[i] = make_uint2(lo, hi);
  }
}

__global__ void AddNormedKernel(const float* o, const float* w_post, float* x, const float* w_pre,
                                bf16_t* h, int dim, float eps, bool plus_one) {
  PdlLaunchDependents();
  PdlWait();
  __shared__ float red[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += o[base + i] * o[base + i];
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  float ss2 = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = plus_one ? 1.0f + w_post[i] : w_post[i];
    const float v = x[base + i] + o[base + i] * inv * g;
    x[base + i] = v;
    ss2 += v * v;
  }
  if (w_pre == nullptr) return;
  ss2 = BlockSum(ss2, red);
  const float inv2 = 1.0f / sqrtf(ss2 / dim + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float g = plus_one ? 1.0f + w_pre[i] : w_pre[i];
    h[base + i] = ToBf(x[base + i] * inv2 * g);
  }
}

// RmsNormVecKernel after the residual add of a GEMM whose K was split into
// nparts fp32 planes: x[src] += planes[0][src] + ... (in plane order, so the
// sum is deterministic), written back to x, then normalised. One row per
// block; every plane's float4 of a thread is requested before any is added.
// At most 512 threads of 128 registers (16 planes' float4s in flight).
// Decode steps wait on this kernel twice a layer, so its own latency is the
// step's: the norm weights and the row index (written by no kernel of the
// step) are read before the wait, and rows of one float4 per thread (2,048
// floats at 512 threads) stay in registers between the two passes (longer
// rows re-read their sums, from L1; two float4s per thread spilled).
// kParts bounds nparts: the planes' float4s held at once set the registers
// (kParts 16: 104 a thread, 53K a block; 8: 64, 32K), and a block of 53K
// left no room on its SM for the warpgroup GEMM blocks around it (12K
// registers each): the next GEMM's blocks could not become resident, and
// request their first weights, until the norm ended, nor could the norm's
// blocks start beside the two blocks of the GEMM before it.
constexpr int kMaxParts = kMaxWgmmaSplits;
template <int kParts>
__global__ void __launch_bounds__(512)
    AddPartsRmsNormKernel(float* x, const float* parts, int nparts, int64_t plane,
                          const int32_t* rows_idx, const float* w, bf16_t* out, int dim, float eps,
                          bool plus_one) {
  PdlLaunchDependents();
  __shared__ float red[32];
  const int nv = dim / 4;
  const int tid = threadIdx.x;
  const bool in_regs = nv <= static_cast<int>(blockDim.x);
  const float4* wv = reinterpret_cast<const float4*>(w);
  const float4 g = in_regs && tid < nv ? __ldg(wv + tid) : make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t src = rows_idx ? rows_idx[blockIdx.x] : blockIdx.x;
  PdlWait();
  float4* xr = reinterpret_cast<float4*>(x + src * dim);
  const float4* pr = reinterpret_cast<const float4*>(parts + src * dim);
  const int64_t pv = plane / 4;
  // x[i] += the planes' float4s at i; returns the sum, written back.
  auto add = [&](int i) {
    float4 p[kParts];
#pragma unroll
    for (int q = 0; q < kParts; ++q)
      if (q < nparts) p[q] = pr[q * pv + i];
    float4 v = xr[i];
#pragma unroll
    for (int q = 0; q < kParts; ++q)
      if (q < nparts) {
        v.x += p[q].x;
        v.y += p[q].y;
        v.z += p[q].z;
        v.w += p[q].w;
      }
    xr[i] = v;
    return v;
  };
  auto store = [&](int i, float4 v, float4 gi, float inv) {
    if (plus_one) gi = make_float4(1.f + gi.x, 1.f + gi.y, 1.f + gi.z, 1.f + gi.w);
    const uint32_t lo = static_cast<uint32_t>(ToBf(v.x * inv * gi.x)) |
                        static_cast<uint32_t>(ToBf(v.y * inv * gi.y)) << 16;
    const uint32_t hi = static_cast<uint32_t>(ToBf(v.z * inv * gi.z)) |
                        static_cast<uint32_t>(ToBf(v.w * inv * gi.w)) << 16;
    reinterpret_cast<uint2*>(out + static_cast<int64_t>(blockIdx.x) * dim)[i] = make_uint2(lo, hi);
  };
  float ss = 0.f;
  if (in_regs) {
    const float4 v = tid < nv ? add(tid) : make_float4(0.f, 0.f, 0.f, 0.f);
    ss = BlockSum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w, red);
    if (tid < nv) store(tid, v, g, 1.0f / sqrtf(ss / dim + eps));
    return;
  }
#pragma unroll 1
  for (int i = tid; i < nv; i += blockDim.x) {
    const float4 v = add(i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = BlockSum(ss, red);
  const float inv = 1.0f / sqrtf(ss / dim + eps);
  for (int i = tid; i < nv; i += blockDim.x) store(i, xr[i], __ldg(wv + i), inv);
}

int NormThreads(int dim) { return dim >= 1024 ? 512 : dim >= 256 ? 256 : 128; }

}  // namespace

cudaError_t LaunchEmbed(const bf16_t* embed, const int32_t* tokens, const int32_t* picks, int rows,
                        int dim, float scale, float* x, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  const bool vec = dim % 8 == 0 && reinterpret_cast<uintptr_t>(embed) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  return LaunchPdl(EmbedKernel, dim3(rows), dim3(256), 0, launch, embed, tokens, picks, dim, scale,
                   x, vec);
}

cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows_idx, const float* w, bf16_t* out,
                          int rows, int dim, float eps, bool plus_one, LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  const int threads = NormThreads(dim);
  if (dim % 4 == 0 && dim <= threads * 4 * kNormVec) {
    // Many rows: kNormVec float4 loads per thread, in fewer and fuller
    // blocks (with one per thread a 7,168-row prefill step's norm ran at
    // 1.9 TB/s, 51 us; -38% a row). Few rows keep the wide blocks.
    const int vec_threads = rows >= kManyRows
                                ? std::max(32, (dim / 4 + kNormVec * 32 - 1) / (kNormVec * 32) * 32)
                                : threads;
    return LaunchPdl(RmsNormVecKernel, dim3(rows), dim3(vec_threads), 0, launch, x, rows_idx, w,
                     out, dim, eps, plus_one);
  }
  return LaunchPdl(RmsNormKernel, dim3(rows), dim3(threads), 0, launch, x, rows_idx, w, out, dim,
                   eps, plus_one);
}

cudaError_t LaunchAddPartsRmsNorm(float* x, const float* parts, int nparts, int64_t plane,
                                  const int32_t* rows_idx, const float* w, bf16_t* out, int rows,
                                  int dim, float eps, bool plus_one, LaunchConfig launch) {
  if (!AddPartsRmsNormSupported(dim, nparts) || plane % 4 != 0) return cudaErrorInvalidValue;
  if (rows <= 0) return cudaSuccess;
  auto* kernel = nparts > 8   ? AddPartsRmsNormKernel<kMaxParts>
                 : nparts > 4 ? AddPartsRmsNormKernel<8>
                              : AddPartsRmsNormKernel<4>;
  return LaunchPdl(kernel, dim3(rows), dim3(NormThreads(dim)), 0, launch, x, parts, nparts, plane,
                   rows_idx, w, out, dim, eps, plus_one);
}

cudaError_t LaunchAddNormed(const float* o, const float* w_post, float* x, const float* w_pre,
                            bf16_t* h, int rows, int dim, float eps, bool plus_one,
                            LaunchConfig launch) {
  if (rows <= 0) return cudaSuccess;
  return LaunchPdl(AddNormedKernel, dim3(rows), dim3(NormThreads(dim)), 0, launch, o, w_post, x,
                   w_pre, h, dim, eps, plus_one);
}

}  // namespace agentkv::backend::cuda::kernels
