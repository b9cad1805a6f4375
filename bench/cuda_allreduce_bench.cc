// Tensor parallelism's all-reduce (NCCL, fp32 sum, in place) from plain
// buffers against NCCL symmetric windows (NcclWindows), on GPUs 0 and 1
// (AGENTKV_BENCH_GPUS=n: the first n), one thread and stream per rank as
// TpBackend runs them: each measurement captures 64 all-reduces into one
// CUDA graph per rank (decode steps hold theirs in graphs), launches it
// 20 times after a warm-up launch, and reports the slowest rank's
// microseconds per all-reduce (manual time). Sizes 8 KiB .. 1 MiB: a
// decode step's residual is rows x hidden x 4 bytes (8 KiB: one row at
// hidden 2,048; 16 KiB: one at 4,096; 1 MiB: 64 rows at 4,096), with 16
// to 48 KiB in 8 KiB steps around where the window stops winning: they
// place kTpWindowReduceMaxBytes (tp_reduce_plan.h), the largest sum the
// backend runs from the window. window: 0 plain buffers; 1 the window as
// CudaBackend::TpReduce runs it (each all-reduce behind
// kernels::LaunchStreamFence where TpWindowReduceNeedsFence says so for
// the NCCL loaded: counter `fenced`); 2 plain buffers, each all-reduce
// behind the fence (what the fence costs, measured where nothing can race:
// NCCL's usual kernels are not launched as programmatic dependents, while
// unfenced windows on such an NCCL could start a sum before the last one's
// writes show).
// As TpBackend::Create, one all-reduce per rank outside any graph before
// the first capture (NCCL connects its ranks there); the windows and the
// communicators are released before the process exits (NCCL's threads
// must not outlive the CUDA runtime). NVLink multicast stays off
// (NCCL_NVLS_ENABLE=0 unless set). Without 2 GPUs, NCCL, or (window runs)
// symmetric windows, the runs are skipped with the reason.
//   cuda_allreduce_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#ifdef AGENTKV_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/kernels/tp.h"
#include "engine/backend/cuda/nccl_comms.h"
#include "engine/backend/cuda/nccl_windows.h"
#include "engine/backend/cuda/status.h"
#include "engine/backend/tp_reduce_plan.h"

namespace agentkv::backend::cuda {
namespace {

constexpr int kOps = 64;       // all-reduces per graph
constexpr int kLaunches = 20;  // graph launches timed
constexpr size_t kMaxBytes = size_t{1} << 20;

// The communicators, a window and plain buffers of kMaxBytes per rank,
// made once for the process and released at its exit.
struct Setup {
  std::string error;  // why nothing can run
  std::string window_error;
  std::unique_ptr<NcclComms> comms;
  std::unique_ptr<NcclWindows> windows;
  std::vector<DeviceBuffer> plain;
  bool fence = false;  // TpWindowReduceNeedsFence for the NCCL loaded
};

Setup* g_setup = nullptr;

// Runs fn(r) on one thread per rank (its device current); the first error.
Status OnRanks(int n, const std::function<Status(int)>& fn) {
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      const cudaError_t e = cudaSetDevice(r);
      st[r] = e == cudaSuccess ? fn(r) : CudaStatus(e, "cudaSetDevice", __FILE__, __LINE__);
    });
  for (std::thread& t : threads) t.join();
  for (const Status& x : st)
    if (!x.ok()) return x;
  return Status::Ok();
}

// At exit, before the CUDA runtime's own teardown (registered earlier, so
// run later): the windows (deregistered from the live communicators), the
// buffers, then the communicators.
void Release() {
  if (g_setup == nullptr) return;
  g_setup->windows.reset();
  for (size_t r = 0; r < g_setup->plain.size(); ++r) {
    cudaSetDevice(static_cast<int>(r));
    g_setup->plain[r].Free();
  }
  g_setup->comms.reset();
}

Setup& Get() {
  static Setup* s = [] {
    auto* x = new Setup();
    g_setup = x;
    int n = 2;
    if (const char* g = std::getenv("AGENTKV_BENCH_GPUS")) n = std::max(2, std::atoi(g));
    if (VisibleGpus() < n) {
      x->error =
          "needs " + std::to_string(n) + " GPUs, " + std::to_string(VisibleGpus()) + " visible";
      return x;
    }
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // before the first communicator
    std::vector<int> devices(n);
    for (int i = 0; i < n; ++i) devices[i] = i;
    NcclOptions opts;
    const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
    opts.nvls_enable = nvls != nullptr ? nvls : "0";
    auto comms = NcclComms::Create(devices, opts);
    if (!comms.ok()) {
      x->error = comms.status().ToString();
      return x;
    }
    x->comms = std::move(comms).value();
    std::atexit(Release);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(r);
      DeviceBuffer b;
      if (!b.Allocate(kMaxBytes).ok() || cudaMemset(b.get(), 0, kMaxBytes) != cudaSuccess) {
        x->error = "out of device memory";
        return x;
      }
      x->plain.push_back(std::move(b));
    }
    // One all-reduce per rank outside any graph (as TpBackend::Create):
    // NCCL connects its ranks here, not inside the first capture.
    const Status warm = OnRanks(n, [&](int r) -> Status {
      cudaStream_t s = nullptr;
      CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      Status st = x->comms->rank(r).SumF32(x->plain[r].get<float>(), 1024, s);
      const cudaError_t sync = cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
      RETURN_IF_ERROR(st);
      CUDA_RETURN_IF_ERROR(sync);
      return Status::Ok();
    });
    if (!warm.ok()) {
      x->error = warm.ToString();
      return x;
    }
    auto w = NcclWindows::Create(*x->comms, kMaxBytes);
    if (w.ok()) {
      x->windows = std::move(w).value();
      int major = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
      x->fence = TpWindowReduceNeedsFence(NcclLoadedVersion(), major);
    } else {
      x->window_error = w.status().ToString();
    }
    std::fprintf(stderr, "allreduce bench: %d GPUs, NCCL %d, windows: %s\n", n, NcclLoadedVersion(),
                 x->windows ? (x->fence ? "made, fenced" : "made") : x->window_error.c_str());
    return x;
  }();
  return *s;
}

Status Check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? Status::Ok() : CudaStatus(e, what, __FILE__, __LINE__);
}

// One rank's timing: microseconds per all-reduce of `count` floats at
// `buf`, each behind kernels::LaunchStreamFence with `fence`.
Status TimeRank(const NcclRank& rank, int device, float* buf, size_t count, bool fence,
                double* us) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  Status st =
      Check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < kOps && st.ok(); ++i) {
    if (fence) st = Check(kernels::LaunchStreamFence(s), "LaunchStreamFence");
    if (st.ok()) st = rank.SumF32(buf, count, s);
  }
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  if (st.ok()) st = Check(end, "cudaStreamEndCapture");
  if (st.ok()) st = Check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
  if (st.ok()) {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaGraphLaunch(exec, s);  // warm-up
    cudaEventRecord(a, s);
    for (int i = 0; i < kLaunches; ++i) cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    st = Check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    *us = 1e3 * ms / (kLaunches * kOps);
  }
  if (a) cudaEventDestroy(a);
  if (b) cudaEventDestroy(b);
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return st;
}

void AllReduce(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const bool window = state.range(1) == 1;
  if (!DeviceAvailable().ok()) {
    state.SkipWithError("no GPU");
    return;
  }
  Setup& s = Get();
  if (!s.error.empty()) {
    state.SkipWithError(s.error.c_str());
    return;
  }
  if (window && !s.windows) {
    state.SkipWithError(s.window_error.c_str());
    return;
  }
  const int n = s.comms->size();
  const bool fence = (window && s.fence) || state.range(1) == 2;
  double worst = 0;
  for (auto _ : state) {
    std::vector<double> us(n, 0.0);
    std::vector<Status> st(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        float* buf = window ? static_cast<float*>(s.windows->ptr(r)) : s.plain[r].get<float>();
        st[r] = TimeRank(s.comms->rank(r), s.comms->device(r), buf, bytes / 4, fence, &us[r]);
      });
    for (std::thread& t : threads) t.join();
    for (const Status& x : st)
      if (!x.ok()) {
        state.SkipWithError(x.ToString().c_str());
        return;
      }
    worst = *std::max_element(us.begin(), us.end());
    state.SetIterationTime(worst * 1e-6);
  }
  state.counters["us_per_allreduce"] = worst;
  state.counters["fenced"] = fence ? 1 : 0;
  state.counters["GB_s_busbw"] = bytes * 2.0 * (n - 1) / n / (worst * 1e-6) / 1e9;
}

BENCHMARK(AllReduce)
    ->ArgNames({"bytes", "window"})
    ->ArgsProduct({{8 << 10, 16 << 10, 24 << 10, 32 << 10, 40 << 10, 48 << 10, 64 << 10, 128 << 10,
                    256 << 10, 512 << 10, 1 << 20},
                   {0, 1, 2}})
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace agentkv::backend::cuda

#endif
