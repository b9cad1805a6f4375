// Decode-step GEMMs on the GPU: y[m][n] = x[m] . w[n] for the Llama-3.2-1B
// shapes (qkv, o, gate_up, down, lm_head) at 1-64 rows, by the skinny
// tensor-core kernel (up to 8 rows; its own split of K and forced ones),
// cuBLAS and the GEMV (up to 8 rows). The weights rotate through copies totalling more than
// 200 MiB, so that each launch reads them from memory, not from the 50 MiB
// L2. The 50 launches of an iteration are one CUDA graph, as in a decode
// step (launched one by one, the host's ~10 us per launch would be timed).
// Reported: microseconds per launch (CUDA events around the graph) and
// weight bytes per second. Without a GPU (or CUDA) nothing is run.
#include <benchmark/benchmark.h>

#ifdef AGENTKV_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_buffer.h"

namespace agentkv::cuda {
namespace {

struct Shape {
  const char* name;
  int n, k;
};
constexpr Shape kShapes[] = {{"qkv", 3072, 2048},
                             {"o", 2048, 2048},
                             {"gate_up", 16384, 2048},
                             {"down", 2048, 8192},
                             {"lm_head", 128256, 2048}};

enum class Impl { kSkinny, kCublas, kGemv };

struct Fixture {
  std::vector<DeviceBuffer> w;
  DeviceBuffer x, y, ws;
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  int sms = 0;
  ~Fixture() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : ev)
      if (e != nullptr) cudaEventDestroy(e);
    if (cublas != nullptr) cublasDestroy(cublas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

void Run(benchmark::State& state, Shape s, int m, Impl impl, int splits) {
  if (!DeviceAvailable().ok()) {
    state.SkipWithError("no GPU");
    return;
  }
  Fixture f;
  cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t wbytes = static_cast<size_t>(s.n) * s.k * 2;
  const size_t copies = std::max<size_t>(2, (200u << 20) / wbytes + 1);
  f.w.resize(copies);
  for (auto& b : f.w) {
    if (!b.Allocate(wbytes).ok()) {
      state.SkipWithError("out of device memory");
      return;
    }
    cudaMemset(b.get(), 0x3c, wbytes);  // small finite bf16 values
  }
  (void)f.x.Allocate(static_cast<size_t>(m) * s.k * 2);
  (void)f.y.Allocate(static_cast<size_t>(m) * s.n * 4);
  cudaMemset(f.x.get(), 0x3c, f.x.bytes());
  cudaMemset(f.y.get(), 0, f.y.bytes());
  cudaStreamCreateWithFlags(&f.stream, cudaStreamNonBlocking);
  cublasCreate(&f.cublas);
  cublasSetStream(f.cublas, f.stream);
  (void)f.ws.Allocate(32u << 20);
  cublasSetWorkspace(f.cublas, f.ws.get(), f.ws.bytes());
  cudaEventCreate(&f.ev[0]);
  cudaEventCreate(&f.ev[1]);
  constexpr int kLaunches = 50;
  size_t next = 0;
  auto launch = [&]() -> bool {
    const auto* w = f.w[next++ % copies].get<bf16_t>();
    const auto* x = f.x.get<bf16_t>();
    if (impl == Impl::kSkinny)
      return LaunchSkinnyGemm(x, w, f.y.get(), true, m, s.n, s.k, 0.f, f.sms, f.stream, splits) ==
             cudaSuccess;
    if (impl == Impl::kGemv)
      return LaunchGemv(x, w, f.y.get(), true, m, s.n, s.k, 0.f, f.sms, f.stream) == cudaSuccess;
    const float alpha = 1.f, beta = 0.f;
    return cublasGemmEx(f.cublas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, m, s.k, &alpha, w, CUDA_R_16BF,
                        s.k, x, CUDA_R_16BF, s.k, &beta, f.y.get(), CUDA_R_32F, s.n,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  };
  for (size_t i = 0; i < copies; ++i) launch();  // lazy loading, clocks
  cudaGraph_t graph = nullptr;
  bool ok = cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  for (int i = 0; i < kLaunches && ok; ++i) ok = launch();
  ok = cudaStreamEndCapture(f.stream, &graph) == cudaSuccess && ok;
  ok = ok && cudaGraphInstantiate(&f.exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!ok || cudaStreamSynchronize(f.stream) != cudaSuccess) {
    state.SkipWithError("launch or capture failed");
    return;
  }
  for (auto _ : state) {
    cudaEventRecord(f.ev[0], f.stream);
    cudaGraphLaunch(f.exec, f.stream);
    cudaEventRecord(f.ev[1], f.stream);
    cudaEventSynchronize(f.ev[1]);
    float ms = 0;
    cudaEventElapsedTime(&ms, f.ev[0], f.ev[1]);
    state.SetIterationTime(ms / 1e3 / kLaunches);
  }
  state.counters["weight_GBps"] = benchmark::Counter(static_cast<double>(wbytes),
                                                     benchmark::Counter::kIsIterationInvariantRate);
  if (impl == Impl::kSkinny)
    state.counters["splits"] = splits > 0 ? splits : SkinnyGemmSplits(s.n, s.k, f.sms);
}

int Register() {
  for (const Shape& s : kShapes) {
    for (int m : {1, 8, 16, 32, 64}) {
      const std::string base = std::string(s.name) + "/m" + std::to_string(m);
      auto reg = [&](const std::string& name, Impl impl, int splits) {
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& st) { Run(st, s, m, impl, splits); })
            ->UseManualTime()
            ->Iterations(20)
            ->Unit(benchmark::kMicrosecond);
      };
      if (SkinnyGemmSupported(m, s.n, s.k)) reg(base + "/skinny", Impl::kSkinny, 0);
      for (int sp : {1, 2, 4, 8})
        if (SkinnyGemmSupported(m, s.n, s.k) && sp <= s.k / 128)
          reg(base + "/skinny_split" + std::to_string(sp), Impl::kSkinny, sp);
      reg(base + "/cublas", Impl::kCublas, 0);
      if (GemvSupported(m, s.k)) reg(base + "/gemv", Impl::kGemv, 0);
    }
  }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace agentkv::cuda
#endif  // AGENTKV_HAVE_CUDA
