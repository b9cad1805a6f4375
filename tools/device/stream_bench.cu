// How fast can a decode GEMM's weight stream be, by the copy it uses? A
// development tool for the GPU machine, not part of the build:
//   nvcc -O3 -arch=sm_90a -std=c++17 tools/device/stream_bench.cu -o /tmp/stream_bench
//   /tmp/stream_bench
// Each block streams the rows of a [N][K] bf16 matrix's 64-row tile (the
// warpgroup GEMM's layout: a stage is 64 rows x 256 bytes, the rows K * 2
// bytes apart) through a ring of shared-memory stages, two blocks of 128
// threads per SM, as the GEMM does, and only sums a word per stage (so the
// copies are all that is timed):
//   cp.async: every thread copies 16-byte chunks (the GEMM's LoadTile);
//   bulk:     one thread issues a 256-byte cp.async.bulk per row, completed
//             on an mbarrier (the Tensor Memory Accelerator's copy engine).
// Printed: us per pass over the matrix and GB/s, for 2-6 stages, on the
// gate_up (16384 x 2048) and LM head (128256 x 2048) shapes.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "check_cuda.cuh"

constexpr int kRows = 64, kRowBytes = 256, kStageBytes = kRows * kRowBytes;  // 16 KiB
__device__ unsigned g_sink;

__device__ __forceinline__ uint32_t Smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// kX: each stage also copies the same 64 rows x 256 bytes of a small
// matrix x (the GEMM's activations, from L2), into a second slot.
template <int S, bool kX = false>
__global__ void __launch_bounds__(128)
    CpAsyncStream(const char* w, int64_t row_bytes, int stages, const char* x) {
  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const char* base = w + static_cast<int64_t>(blockIdx.x) * kRows * row_bytes;
  auto copy = [&](char* dst, const char* src, int st) {
    for (int i = tid; i < kStageBytes / 16; i += 128) {
      const int r = i / (kRowBytes / 16), c = i % (kRowBytes / 16);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(Smem(dst + i * 16)),
                   "l"(src + r * row_bytes + static_cast<int64_t>(st) * kRowBytes + c * 16)
                   : "memory");
    }
  };
  auto issue = [&](int st) {
    copy(smem + (st % S) * kStageBytes * (kX ? 2 : 1), base, st);
    if (kX) copy(smem + (st % S) * kStageBytes * 2 + kStageBytes, x, st);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  unsigned acc = 0;
  for (int s = 0; s < S - 1; ++s)
    if (s < stages)
      issue(s);
    else
      asm volatile("cp.async.commit_group;\n" ::: "memory");
  for (int i = 0; i < stages; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2) : "memory");
    __syncthreads();
    if (i + S - 1 < stages)
      issue(i + S - 1);
    else
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    acc += reinterpret_cast<const unsigned*>(smem + (i % S) * kStageBytes * (kX ? 2 : 1))[tid];
  }
  if (acc == 0x12345678u) g_sink = acc;
}

template <int S>
__global__ void __launch_bounds__(128)
    BulkStream(const char* w, int64_t row_bytes, int stages, const char*) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t full[S];
  const int tid = threadIdx.x;
  const char* base = w + static_cast<int64_t>(blockIdx.x) * kRows * row_bytes;
  if (tid == 0)
    for (int s = 0; s < S; ++s)
      asm volatile("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(Smem(&full[s])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  auto issue = [&](int st) {
    if (tid != 0) return;
    const uint32_t bar = Smem(&full[st % S]);
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(bar), "r"(kStageBytes)
                 : "memory");
    char* dst = smem + (st % S) * kStageBytes;
    for (int r = 0; r < kRows; ++r)
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];\n" ::"r"(Smem(dst + r * kRowBytes)),
          "l"(base + r * row_bytes + static_cast<int64_t>(st) * kRowBytes), "n"(kRowBytes), "r"(bar)
          : "memory");
  };
  unsigned acc = 0;
  for (int s = 0; s < S - 1 && s < stages; ++s) issue(s);
  for (int i = 0; i < stages; ++i) {
    const uint32_t bar = Smem(&full[i % S]);
    const uint32_t parity = (i / S) & 1;
    asm volatile(
        "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::
            "r"(bar),
        "r"(parity)
        : "memory");
    acc += reinterpret_cast<const unsigned*>(smem + (i % S) * kStageBytes)[tid];
    __syncthreads();  // every thread is done with stage i - 1's slot
    if (i + S - 1 < stages) issue(i + S - 1);
  }
  if (acc == 0x12345678u) g_sink = acc;
}

template <int S, bool kX = false>
float Time(bool bulk, const char* w, int n, int k, const char* x = nullptr) {
  const int blocks = n / kRows, stages = k * 2 / kRowBytes;
  // 97 KiB whatever the stages: two blocks an SM, as the GEMM.
  const size_t smem = 97 * 1024;
  auto kern = bulk ? BulkStream<S> : CpAsyncStream<S, kX>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) kern<<<blocks, 128, smem>>>(w, int64_t{k} * 2, stages, x);
  CK(cudaEventRecord(a));
  const int reps = 20;
  for (int i = 0; i < reps; ++i) kern<<<blocks, 128, smem>>>(w, int64_t{k} * 2, stages, x);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return ms * 1000 / reps;
}

int main() {
  const int k = 2048;
  const int shapes[] = {16384, 128256};
  char* w;
  CK(cudaMalloc(&w, size_t{128256} * k * 2));
  CK(cudaMemset(w, 1, size_t{128256} * k * 2));
  for (int n : shapes) {
    const double mb = double(n) * k * 2 / 1e6;
    std::printf("n %d k %d (%.1f MB): us (GB/s)\n", n, k, mb);
    auto row = [&](const char* name, float us) {
      std::printf("  %-14s %8.1f (%5.0f)\n", name, us, mb * 1e3 / us);
    };
    row("cp.async S=2", Time<2>(false, w, n, k));
    row("cp.async S=3", Time<3>(false, w, n, k));
    row("cp.async S=4", Time<4>(false, w, n, k));
    row("cp.async S=6", Time<6>(false, w, n, k));
    row("+x S=2", Time<2, true>(false, w, n, k, w));
    row("+x S=3", Time<3, true>(false, w, n, k, w));
    row("bulk S=2", Time<2>(true, w, n, k));
    row("bulk S=3", Time<3>(true, w, n, k));
    row("bulk S=4", Time<4>(true, w, n, k));
    row("bulk S=6", Time<6>(true, w, n, k));
  }
  return 0;
}
