// Can a prompt step's memory-bound kernels hide under its compute-bound
// GEMMs? A development tool for the GPU machine, not part of the build:
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/device/overlap_bench.cu -o /tmp/overlap_bench -lcublasLt
//   /tmp/overlap_bench
// A cuBLASLt bf16 GEMM of a prompt step's shape (the MLP split in two
// halves of the intermediate features) runs on one stream while the gated
// activation of the other half (read 2 x, write 1 x bf16) runs on a second
// one. Printed per case: the GEMM alone, the activation alone, the two one
// after the other on one stream, and the two on two streams (the
// activation's stream at high priority), for cuBLASLt's SM-count target
// of 0 (all) and fewer SMs (the rest left to the activation). Each time is
// the mean of 20 repetitions, timed by events.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check_cuda.cuh"

#define LK(x)                                                                         \
  do {                                                                                \
    cublasStatus_t s_ = (x);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      std::fprintf(stderr, "%s:%d %s: cublas %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

__global__ void Fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = __float2bfloat16(((h >> 8) & 0xFFFF) / 65536.f - 0.5f);
  }
}

// out[r][j] = silu(in[r][2j]) * in[r][2j + 1], 8 inputs a thread.
__global__ void GatedAct(const uint4* in, uint2* out, size_t n8) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const uint4 v = in[i];
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  __nv_bfloat16 o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(p[j]);
    o[j] = __float2bfloat16(f.x / (1.f + __expf(-f.x)) * f.y);
  }
  out[i] = *reinterpret_cast<const uint2*>(o);
}

struct Gemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  int m, n, k;
  bool f32;
};

cublasLtHandle_t g_lt;
void* g_ws;
constexpr size_t kWs = 64 << 20;

Gemm MakeGemm(int m, int n, int k, bool f32, int sm_target) {
  Gemm g;
  g.m = m, g.n = n, g.k = k, g.f32 = f32;
  LK(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T;
  LK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  if (sm_target > 0)
    LK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                      sizeof(sm_target)));
  LK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, n, k));
  LK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, m, k));
  LK(cublasLtMatrixLayoutCreate(&g.c, f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs,
                                          sizeof(kWs)));
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(g_lt, g.op, g.a, g.b, g.c, g.c, pref, 1, &r, &found));
  if (found == 0) std::exit(2);
  g.algo = r.algo;
  cublasLtMatmulPreferenceDestroy(pref);
  return g;
}

void RunGemm(const Gemm& g, const void* w, const void* x, void* y, float beta, cudaStream_t s) {
  const float alpha = 1.f;
  LK(cublasLtMatmul(g_lt, g.op, &alpha, w, g.a, x, g.b, &beta, y, g.c, y, g.c, &g.algo, g_ws, kWs,
                    s));
}

int main() {
  int num_sms = 0;
  CK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  LK(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_ws, kWs));
  const int M = 8192, H = 2048, I = 8192;  // the Llama-3.2-1B shape, 8,192 prompt rows
  __nv_bfloat16 *x, *wgu, *wd, *gu, *act;
  float* y;
  CK(cudaMalloc(&x, (size_t)M * H * 2));
  CK(cudaMalloc(&wgu, (size_t)2 * I * H * 2));
  CK(cudaMalloc(&wd, (size_t)H * I * 2));
  CK(cudaMalloc(&gu, (size_t)M * 2 * I * 2));
  CK(cudaMalloc(&act, (size_t)M * I * 2));
  CK(cudaMalloc(&y, (size_t)M * H * 4));
  Fill<<<1024, 256>>>(x, (size_t)M * H, 1);
  Fill<<<1024, 256>>>(wgu, (size_t)2 * I * H, 2);
  Fill<<<1024, 256>>>(wd, (size_t)H * I, 3);
  Fill<<<1024, 256>>>(gu, (size_t)M * 2 * I, 4);
  CK(cudaMemset(y, 0, (size_t)M * H * 4));
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, hi));
  cudaEvent_t e0, e1, fork, join;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  // The activation of one half: M x I input (gate/up pairs), M x I / 2 out.
  const size_t n8 = (size_t)M * I / 8;
  auto run_act = [&](cudaStream_t s) {
    GatedAct<<<(unsigned)((n8 + 255) / 256), 256, 0, s>>>(reinterpret_cast<const uint4*>(gu),
                                                          reinterpret_cast<uint2*>(act), n8);
  };
  auto time = [&](auto&& body) {
    for (int i = 0; i < 3; ++i) body();
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0, s1));
    const int reps = 20;
    for (int i = 0; i < reps; ++i) body();
    CK(cudaEventRecord(e1, s1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.f / reps;
  };
  std::printf("SMs %d; activation of one half alone: %.1f us\n", num_sms,
              time([&] { run_act(s1); }));
  struct Case {
    const char* name;
    int n, k;
    bool f32;
    const void* w;
    const void* in;
    void* out;
    float beta;
  };
  const Case cases[] = {
      {"gate_up half (n 8192, k 2048, bf16)", I, H, false, wgu, x, gu + (size_t)M * I, 0.f},
      {"down half (n 2048, k 4096, fp32 += )", H, I / 2, true, wd, act, y, 1.f},
  };
  for (const Case& c : cases) {
    std::printf("%s\n  sm_target  gemm_us  serial_us  overlap_us  overlap_lowprio_us\n", c.name);
    for (int target : {0, num_sms - 4, num_sms - 8, num_sms - 16, num_sms - 24, num_sms - 32}) {
      Gemm g = MakeGemm(M, c.n, c.k, c.f32, target);
      auto gemm = [&](cudaStream_t s) { RunGemm(g, c.w, c.in, c.out, c.beta, s); };
      const float tg = time([&] { gemm(s1); });
      const float ts = time([&] {
        gemm(s1);
        run_act(s1);
      });
      auto overlap = [&](cudaStream_t sa) {
        CK(cudaEventRecord(fork, s1));
        CK(cudaStreamWaitEvent(sa, fork));
        gemm(s1);
        run_act(sa);
        CK(cudaEventRecord(join, sa));
        CK(cudaStreamWaitEvent(s1, join));
      };
      const float to = time([&] { overlap(s2); });
      cudaStream_t s3;
      CK(cudaStreamCreateWithPriority(&s3, cudaStreamNonBlocking, lo));
      const float tl = time([&] { overlap(s3); });
      CK(cudaStreamDestroy(s3));
      std::printf("  %9d  %7.1f  %9.1f  %10.1f  %18.1f\n", target, tg, ts, to, tl);
    }
  }
  return 0;
}
