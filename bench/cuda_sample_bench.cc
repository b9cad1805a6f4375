// Drawing tokens on the GPU (LaunchSampleRows, engine/backend/sample_draw.h's draw)
// against the greedy pick's argmax (LaunchArgmax), at 1, 8 and 64 rows of
// the Llama 3 (128,256) and Qwen (151,936) vocabularies, for the sampling
// settings clients send: temperature alone (the OpenAI and Anthropic
// default), top_p 0.9, top_k 50, and all of temperature 0.7, top_k 50, top_p
// 0.9, min_p 0.05. Logits are random normal (sd 2), so top_p's nucleus is
// wide. Each iteration times 20 launches between CUDA events; reported:
// microseconds per launch (the whole batch of rows). Without a GPU (or
// CUDA) nothing is run.
#include <benchmark/benchmark.h>

#ifdef AGENTKV_HAVE_CUDA
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/kernels/argmax.h"
#include "engine/backend/cuda/kernels/sample_kernel.h"
#include "engine/backend/cuda/status.h"
#include "engine/backend/row_pick.h"

namespace agentkv::backend::cuda {
namespace {

constexpr int kLaunches = 20;

enum class Mode { kArgmax, kTemperature, kTopP, kTopK, kAll };

void Run(benchmark::State& state, int rows, int vocab, Mode mode) {
  if (!DeviceAvailable().ok()) {
    state.SkipWithError("no GPU");
    return;
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (float& x : logits) x = nd(rng);
  std::uniform_real_distribution<double> un(0.0, 1.0);
  std::vector<RowPick> picks(static_cast<size_t>(rows));
  for (RowPick& p : picks) {
    p.mode = PickMode::kDevice;
    p.sample.u = un(rng);
    if (mode == Mode::kTopP) p.sample.top_p = 0.9f;
    if (mode == Mode::kTopK) p.sample.top_k = 50;
    if (mode == Mode::kAll) {
      p.sample.temperature = 0.7f;
      p.sample.top_k = 50;
      p.sample.top_p = 0.9f;
      p.sample.min_p = 0.05f;
    }
  }
  DeviceBuffer dl, dp, out, scratch;
  if (!dl.Allocate(logits.size() * 4).ok() || !dp.Allocate(picks.size() * sizeof(RowPick)).ok() ||
      !out.Allocate(static_cast<size_t>(rows) * 4).ok() ||
      !scratch.Allocate(kernels::ArgmaxScratchBytes(rows)).ok()) {
    state.SkipWithError("out of device memory");
    return;
  }
  cudaMemcpy(dl.get(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dp.get(), picks.data(), picks.size() * sizeof(RowPick), cudaMemcpyHostToDevice);
  auto launch = [&] {
    if (mode == Mode::kArgmax)
      return kernels::LaunchArgmax(dl.get<float>(), rows, vocab, out.get<int32_t>(), scratch.get(),
                                   nullptr) == cudaSuccess;
    return kernels::LaunchSampleRows(dl.get<float>(), rows, vocab, dp.get<RowPick>(),
                                     out.get<int32_t>(), nullptr) == cudaSuccess;
  };
  if (!launch() || cudaDeviceSynchronize() != cudaSuccess) {
    state.SkipWithError("launch failed");
    return;
  }
  cudaEvent_t ev[2];
  cudaEventCreate(&ev[0]);
  cudaEventCreate(&ev[1]);
  for (auto _ : state) {
    cudaEventRecord(ev[0], nullptr);
    for (int i = 0; i < kLaunches; ++i) launch();
    cudaEventRecord(ev[1], nullptr);
    cudaEventSynchronize(ev[1]);
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[0], ev[1]);
    state.SetIterationTime(ms / 1e3 / kLaunches);
  }
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  state.counters["rows"] = rows;
  state.counters["logits_GBps"] = benchmark::Counter(static_cast<double>(logits.size()) * 4,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

int Register() {
  const std::pair<const char*, Mode> modes[] = {{"argmax", Mode::kArgmax},
                                                {"temperature", Mode::kTemperature},
                                                {"top_p", Mode::kTopP},
                                                {"top_k", Mode::kTopK},
                                                {"all", Mode::kAll}};
  for (int vocab : {128256, 151936})
    for (int rows : {1, 8, 64})
      for (const auto& [name, mode] : modes) {
        const std::string n =
            "sample/v" + std::to_string(vocab) + "/r" + std::to_string(rows) + "/" + name;
        benchmark::RegisterBenchmark(
            n.c_str(),
            [rows, vocab, mode = mode](benchmark::State& s) { Run(s, rows, vocab, mode); })
            ->UseManualTime()
            ->Iterations(20)
            ->Unit(benchmark::kMicrosecond);
      }
  return 0;
}
const int registered = Register();

}  // namespace
}  // namespace agentkv::backend::cuda
#endif  // AGENTKV_HAVE_CUDA
