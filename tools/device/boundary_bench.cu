// What a kernel boundary costs a memory-bound step, against a grid-wide
// barrier inside one persistent kernel: the question behind a persistent
// decode-layer kernel (bench/RESULTS.md items 59 and 70). A development
// tool for the GPU machine, not part of the build:
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/device/boundary_bench.cu -o /tmp/boundary_bench
//   /tmp/boundary_bench
// Each case reads `phases` disjoint buffers of `mb` MB one after another
// (16-byte streaming loads, summed so that nothing is optimised away):
//   kernels: one kernel per buffer, launched back to back with programmatic
//            dependent launch (each waits for the one before, as a step's
//            kernels do), captured in a CUDA graph;
//   barrier: one cooperative kernel of every resident block, a grid-wide
//            barrier between buffers.
// Both are timed with events over 20 graph / kernel launches; printed: us
// per phase and the effective bandwidth.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "check_cuda.cuh"

namespace cg = cooperative_groups;

__device__ float g_sink;

__device__ __forceinline__ float ReadAll(const uint4* p, size_t n, size_t tid, size_t threads) {
  float acc = 0.f;
  for (size_t i = tid; i < n; i += 4 * threads) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = i + u * threads < n ? __ldcs(p + i + u * threads) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc += __uint_as_float(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
  }
  return acc;
}

__global__ void PhaseKernel(const uint4* p, size_t n) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const float acc = ReadAll(p, n, blockIdx.x * blockDim.x + threadIdx.x, threads);
  if (acc == 12345.f) g_sink = acc;
}

__global__ void PersistentKernel(const uint4* const* bufs, int phases, size_t n) {
  cg::grid_group grid = cg::this_grid();
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  float acc = 0.f;
  for (int ph = 0; ph < phases; ++ph) {
    if (ph > 0) grid.sync();
    acc += ReadAll(bufs[ph], n, blockIdx.x * blockDim.x + threadIdx.x, threads);
  }
  if (acc == 12345.f) g_sink = acc;
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  constexpr int kThreads = 512;
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, PersistentKernel, kThreads, 0));
  const int blocks = sms * per_sm;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("%d SMs, %d blocks of %d threads (%d per SM)\n", sms, blocks, kThreads, per_sm);
  std::printf(
      "| MB a phase | phases | kernels us/phase | barrier us/phase | kernels GB/s | barrier GB/s "
      "|\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (size_t mb : {4, 8, 16, 32, 64}) {
    const int phases = 16;
    const size_t bytes = mb << 20, n = bytes / 16;
    std::vector<uint4*> bufs(phases);
    for (auto& b : bufs) {
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(b, 1, bytes));
    }
    uint4** dbufs;
    CK(cudaMalloc(&dbufs, phases * sizeof(uint4*)));
    CK(cudaMemcpy(dbufs, bufs.data(), phases * sizeof(uint4*), cudaMemcpyHostToDevice));
    // kernels: a graph of `phases` programmatic launches.
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int ph = 0; ph < phases; ++ph) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(blocks);
      cfg.blockDim = dim3(kThreads);
      cfg.stream = s;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, PhaseKernel, static_cast<const uint4*>(bufs[ph]), n));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    auto time = [&](auto&& launch) {
      launch();
      CK(cudaStreamSynchronize(s));
      CK(cudaEventRecord(e0, s));
      for (int r = 0; r < 20; ++r) launch();
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      return ms * 1000.f / 20 / phases;
    };
    const float k_us = time([&] { CK(cudaGraphLaunch(ge, s)); });
    int ph_arg = phases;
    size_t n_arg = n;
    void* args[] = {&dbufs, &ph_arg, &n_arg};
    const float b_us = time([&] {
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(PersistentKernel), dim3(blocks),
                                     dim3(kThreads), args, 0, s));
    });
    std::printf("| %zu | %d | %.2f | %.2f | %.0f | %.0f |\n", mb, phases, k_us, b_us,
                bytes / (k_us * 1e3), bytes / (b_us * 1e3));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    for (auto* b : bufs) CK(cudaFree(b));
    CK(cudaFree(dbufs));
  }
  return 0;
}
