// Weight-streaming GEMM for decode steps of a few rows: y[m][n] = x[m] . w[n]
// (+ beta * y), the weights read once, 16 bytes per lane per load with
// several loads in flight, all M rows of x from shared memory. cuBLAS picks
// tensor-core tiles built for larger M; at M <= 8 this kernel reads the
// weights closer to the memory bandwidth.
#include <cuda_bf16.h>

#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/pdl.cuh"

namespace agentkv::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane

__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, void* y, int N, int K,
               float beta, bool y_f32) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem);
  const int kv = K / 8;  // 16-byte vectors per row
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  // The first weight loads go out before x is staged (and, launched as a
  // dependent, before the kernel that writes x has finished): weights are
  // never written by a step.
  int n = blockIdx.x * kWarps + warp;
  uint4 pre[kUnroll];
  bool have_pre = n < N && lane + 32 * (kUnroll - 1) < kv;
  if (have_pre) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(n) * K);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) pre[u] = __ldg(wr + lane + 32 * u);
  }
  PdlLaunchDependents();
  PdlWait();
  for (int i = threadIdx.x; i < M * kv; i += blockDim.x)
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(x)[i];
  __syncthreads();
  for (; n < N; n += gridDim.x * kWarps) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(n) * K);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    int j = lane;
    for (; j + 32 * (kUnroll - 1) < kv; j += 32 * kUnroll) {
      uint4 wv[kUnroll];
      if (have_pre) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = pre[u];
        have_pre = false;
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = __ldg(wr + j + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float wf[8];
        Unpack(wv[u], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          Unpack(reinterpret_cast<const uint4*>(xs + m * K)[j + 32 * u], xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[e], xf[e], acc[m]);
        }
      }
    }
    for (; j < kv; j += 32) {
      float wf[8];
      Unpack(__ldg(wr + j), wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        Unpack(reinterpret_cast<const uint4*>(xs + m * K)[j], xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[e], xf[e], acc[m]);
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    }
    if (lane < M) {
      float v = 0.f;
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (m == lane) v = acc[m];
      const int64_t at = static_cast<int64_t>(lane) * N + n;
      if (y_f32) {
        float* yf = static_cast<float*>(y);
        yf[at] = beta != 0.f ? beta * yf[at] + v : v;
      } else {
        __nv_bfloat16* yb = static_cast<__nv_bfloat16*>(y);
        yb[at] = __float2bfloat16_rn(beta != 0.f ? beta * __bfloat162float(yb[at]) + v : v);
      }
    }
  }
}

template <int M>
cudaError_t Launch(const bf16_t* x, const bf16_t* w, void* y, int N, int K, float beta, bool y_f32,
                   int num_sms, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(M) * K * sizeof(bf16_t);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        GemvKernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int rows_per_block = kWarps;
  // One row per warp: short rows (k = 2048 is 8 loads per lane) leave no
  // time to ramp a grid-stride loop.
  const int blocks = (N + rows_per_block - 1) / rows_per_block;
  (void)num_sms;
  return LaunchPdl(GemvKernel<M>, dim3(blocks), dim3(kWarps * 32), smem, stream, x, w, y, N, K,
                   beta, y_f32);
}

}  // namespace

// x lives in shared memory: at most 32 KiB of it, so that several blocks
// share an SM and keep enough weight loads in flight.
bool GemvSupported(int m, int k) {
  return m >= 1 && m <= kMaxGemvRows && k % 8 == 0 && static_cast<int64_t>(m) * k * 2 <= 32768;
}

cudaError_t LaunchGemv(const bf16_t* x, const bf16_t* w, void* y, bool y_f32, int m, int n, int k,
                       float beta, int num_sms, cudaStream_t stream) {
  if (!GemvSupported(m, k)) return cudaErrorInvalidValue;
  switch (m) {
    case 1:
      return Launch<1>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    case 2:
      return Launch<2>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    case 3:
      return Launch<3>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    case 4:
      return Launch<4>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    case 5:
      return Launch<5>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    case 6:
      return Launch<6>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    case 7:
      return Launch<7>(x, w, y, n, k, beta, y_f32, num_sms, stream);
    default:
      return Launch<8>(x, w, y, n, k, beta, y_f32, num_sms, stream);
  }
}

}  // namespace agentkv::cuda
